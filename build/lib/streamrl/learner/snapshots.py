"""The self-hosted learner's snapshots: model and optimizer written with
torch.distributed.checkpoint (DCP), each rank its own shards, in the background.

`save` copies the ranks' shards of the model and optimizer to host memory (DCP's
staging) and returns. The files are written by a background thread while the next step
trains. A snapshot is complete only once its `state.json` is written, by rank 0, after
every rank's shards and DCP's metadata are on disk. `LATEST` then names it. A learner
killed mid-write resumes from the previous complete snapshot, and the partial folder is
replaced when that step is snapshotted again.

DCP reshards on load: a snapshot written by N ranks loads on M ranks, or on one.
Nothing is gathered onto one rank, so a 7B model in AdamW (~15 GB of weights, ~56 GB of
optimizer state) is written as N shards of 1/N each, and no rank holds it all. The
weights workers load are written apart, as weight versions (learner/checkpoint.py).

Folder: `step-NNNNNN/` with `shards/` (DCP: `__<rank>_0.distcp` files and `.metadata`),
`rng.pt` (rank 0's torch, numpy and Python RNG) and `state.json` (step, offsets, the
step's record), written in that order.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from streamrl.learner.checkpoint import rng_state, set_rng_state
from streamrl.learner.parallel import Placement
from streamrl.runtime.folders import LATEST_SNAPSHOT

# DCP warns that it runs without a process group when there is one learner process.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


@dataclass
class Pending:
    step: int
    folder: Path
    future: Future
    state: dict
    rng: dict
    keep_every: int


class SnapshotStore:
    """Writes snapshots under `root` in the background, one at a time; loads the newest."""

    def __init__(self, root: Path, placement: Placement):
        self.root, self.placement = root, placement
        self.pending: Pending | None = None
        # The background writes talk over a group of their own: the training step's
        # collectives run on the default group meanwhile.
        self.group = dist.new_group(backend="gloo") if placement.sharded else None

    def save(self, step: int, model, optimizer, state: dict, keep_every: int) -> None:
        """Stage the snapshot of `step` and start writing it (the previous one is finished
        first: one in flight at a time)."""
        self.finish()
        folder = self.root / f"step-{step:06d}"
        if self.placement.is_main:
            shutil.rmtree(folder, ignore_errors=True)  # a partial write of this step, from before a crash
            folder.mkdir(parents=True)
        if self.group is not None:
            dist.barrier()
        shards = {"model": trained_state(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
        future = dcp.async_save(shards, checkpoint_id=str(folder / "shards"), process_group=self.group)
        # async_save without a stager returns a plain Future
        self.pending = Pending(step, folder, future, state, rng_state(), keep_every)  # type: ignore[arg-type]

    def ready(self) -> bool:
        """Whether no write is in flight (finishing the one that has completed)."""
        if self.pending is not None and self.pending.future.done():
            self.finish()
        return self.pending is None

    def finish(self) -> None:
        """Wait for the write in flight; rank 0 then marks it complete and points LATEST at it."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        pending.future.result()  # a failed write raises here, before LATEST could name it
        if not self.placement.is_main:
            return
        torch.save(pending.rng, pending.folder / "rng.pt")
        write_atomically(pending.folder / "state.json", json.dumps({"step": pending.step, **pending.state}))
        write_atomically(self.root / LATEST_SNAPSHOT, pending.folder.name)
        for old in self.root.glob("step-*"):  # keep the newest, and every `keep_every`-th
            number = int(old.name.split("-")[1])
            if number < pending.step and not (pending.keep_every and number % pending.keep_every == 0):
                shutil.rmtree(old, ignore_errors=True)


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def load_snapshot(folder: Path, model, optimizer) -> None:
    """Load a snapshot's model and optimizer into this rank's shards (however many ranks
    wrote it), and the RNG it saved."""
    shards = {"model": trained_state(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(shards, checkpoint_id=str(folder / "shards"))
    set_model_state_dict(model, shards["model"], options=StateDictOptions(strict=False))
    set_optimizer_state_dict(model, optimizer, shards["optimizer"])
    set_rng_state(torch.load(folder / "rng.pt", weights_only=False))


def trained_state(model) -> dict:
    """The model's state a snapshot keeps: all of it, or with frozen weights (a LoRA's
    base) only what trains; the frozen rest is reloaded from the model folder on resume."""
    state = get_model_state_dict(model)
    frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {name: value for name, value in state.items() if name not in frozen} if frozen else state


def bytes_on_disk(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
