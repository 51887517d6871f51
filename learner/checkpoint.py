"""Checkpoints (model, optimizer, RNG, consumed offsets, the step's record) and weight
versions (safetensors directories the workers load).

A checkpoint is written to a temporary folder and renamed into place, and `LATEST`
names the newest one (replaced atomically), so a learner killed at any instant resumes
from a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from streamrl.runtime.folders import LATEST_SNAPSHOT, write_folder
from streamrl.runtime.versions import version_folder


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def write_model_dir(final: Path, model, tokenizer, state_dict: dict | None = None) -> Path:
    """Model and tokenizer as a folder `from_pretrained` (and SGLang) reads, written
    atomically. `state_dict`: the full weights, when the model's own are sharded (FSDP)."""

    def fill(folder: Path) -> None:
        model.save_pretrained(folder, state_dict=state_dict)
        tokenizer.save_pretrained(folder)

    return write_folder(final, fill)


def link_files(source: Path, folder: Path) -> None:
    """Hard-link (or, across file systems, copy) the files of `source` into `folder`.
    Saved model files are never rewritten in place, so a link is as good as a copy."""
    for path in source.iterdir():
        if path.is_file():
            try:
                os.link(path, folder / path.name)
            except OSError:
                shutil.copy2(path, folder / path.name)


def save_checkpoint(
    root: Path, step: int, model_folder: Path | None, optimizer_state: dict, state: dict, keep_every: int = 0
) -> Path:
    """Write checkpoint `step` under root and point LATEST at it; returns its folder.
    `model_folder` holds the step's saved model (its weight version): the checkpoint
    links to its files rather than serialising the model a second time (None: a remote
    trainer's, whose model the training service keeps)."""
    root.mkdir(parents=True, exist_ok=True)

    def fill(folder: Path) -> None:
        if model_folder is not None:
            link_files(model_folder, folder)
        torch.save({"optimizer": optimizer_state, "rng": rng_state()}, folder / "trainer_state.pt")
        (folder / "state.json").write_text(json.dumps({"step": step, **state}))

    final = write_folder(root / f"step-{step:06d}", fill)
    pointer = root / f".{LATEST_SNAPSHOT}.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / LATEST_SNAPSHOT)
    for old in root.glob("step-*"):  # keep the newest, and every `keep_every`-th
        number = int(old.name.split("-")[1])
        if number < step and not (keep_every and number % keep_every == 0):
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / LATEST_SNAPSHOT
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").is_file() else None


def load_state(folder: Path) -> dict:
    return json.loads((folder / "state.json").read_text())


def write_weight_version(root: Path, version: int, model, tokenizer, state_dict: dict | None = None) -> Path:
    """The weights of `version` as a model folder any loader can read."""
    root.mkdir(parents=True, exist_ok=True)
    return write_model_dir(version_folder(root, version), model, tokenizer, state_dict)


def prune_weight_versions(root: Path, keep_last: int = 4) -> None:
    for old in sorted(root.glob("v*"))[:-keep_last]:  # workers only ever need recent versions
        shutil.rmtree(old, ignore_errors=True)
