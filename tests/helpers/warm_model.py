"""The committed warmed tiny model (tests/data/arith_warm, written by
tools/warm_checkpoint.py) as a float32 model folder a run loads."""

from __future__ import annotations

import shutil
from pathlib import Path

WARM = Path(__file__).resolve().parents[1] / "data" / "arith_warm"


def warm_model_folder(destination: Path) -> Path:
    """A float32 copy of the warmed model in `destination` (the workers load a model in its
    saved dtype; the learner in float32: both must hold the same weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(WARM, dtype=torch.float32)
    model.save_pretrained(destination)
    for path in WARM.iterdir():
        if path.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(path, destination / path.name)
    return destination
