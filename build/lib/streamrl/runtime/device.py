"""`trainer.device` made concrete, for the learner and the embedded engine alike."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """auto picks CUDA when torch sees a GPU; cuda without one is an error naming the key."""
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "trainer.device: cuda was asked for but torch sees no CUDA device "
            f"(torch {torch.__version__}); set trainer.device: cpu or auto"
        )
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)
