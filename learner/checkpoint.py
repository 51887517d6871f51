"""Checkpoints (model, optimizer, RNG, consumed offsets, the step's record) and weight
versions (safetensors directories the workers load).

A checkpoint is written to a temporary folder and renamed into place, and `LATEST`
names the newest one (replaced atomically), so a learner killed at any instant resumes
from a complete checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

LATEST = "LATEST"


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def write_model_dir(final: Path, model, tokenizer, extra=None) -> Path:
    """Save model and tokenizer (and `extra(folder)`) to a temporary folder, then rename it
    to `final`: a reader sees the whole folder or none of it."""
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if extra is not None:
        extra(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def save_checkpoint(root: Path, step: int, model, tokenizer, optimizer, state: dict, keep_every: int = 0) -> Path:
    """Write checkpoint `step` under root and point LATEST at it; returns its folder."""
    root.mkdir(parents=True, exist_ok=True)

    def trainer_state(folder: Path) -> None:
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng_state()}, folder / "trainer_state.pt")
        (folder / "state.json").write_text(json.dumps({"step": step, **state}))

    final = write_model_dir(root / f"step-{step:06d}", model, tokenizer, trainer_state)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / LATEST)
    for old in root.glob("step-*"):  # keep the newest, and every `keep_every`-th
        number = int(old.name.split("-")[1])
        if number < step and not (keep_every and number % keep_every == 0):
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").is_file() else None


def load_state(folder: Path) -> dict:
    return json.loads((folder / "state.json").read_text())


def load_trainer_state(folder: Path, optimizer) -> None:
    saved = torch.load(folder / "trainer_state.pt", weights_only=False)
    optimizer.load_state_dict(saved["optimizer"])
    set_rng_state(saved["rng"])


def directory_sha256(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def save_weight_version(root: Path, version: int, model, tokenizer, keep_last: int = 4) -> tuple[Path, str]:
    """The weights of `version` as a model folder any loader can read; returns (folder, sha256)."""
    root.mkdir(parents=True, exist_ok=True)
    final = write_model_dir(root / f"v{version:06d}", model, tokenizer)
    for old in sorted(root.glob("v*"))[:-keep_last]:  # workers only ever need recent versions
        shutil.rmtree(old, ignore_errors=True)
    return final, directory_sha256(final)
