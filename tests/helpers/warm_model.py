"""The committed warmed tiny models (tests/data/<name>_warm: the recipes' written by
tools/warm_checkpoint.py; `boxed` and `judge` by tests/helpers/fine_tune.py) as float32
model folders a run loads."""

from __future__ import annotations

import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def warm_model_folder(destination: Path, name: str = "arith") -> Path:
    """A float32 copy of the warmed model in `destination` (the workers load a model in its
    saved dtype; the learner in float32: both must hold the same weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    warm = DATA / f"{name}_warm"
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    model.save_pretrained(destination)
    for path in warm.iterdir():
        if path.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(path, destination / path.name)
    return destination
