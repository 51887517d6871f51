"""The cluster twin's learner (bench/cluster_twin.py): the learner loop as it is, with
the model's compute replaced by the time the modelled learner GPUs would take
(runtime/gpu_model.py). A step waits `train_s(tokens)`; a weight version is a small
folder (its sha256 checked by the workers as any other); snapshots hold the loop's state.
Each step's time goes to the run's logs (`learner-twin.jsonl`, a line a step) for the bench."""

from __future__ import annotations

import json
import time
from pathlib import Path

from streamrl.learner.batching import TrainItem
from streamrl.learner.checkpoint import latest_checkpoint, save_checkpoint, version_folder
from streamrl.learner.single_process import SingleProcessPolicy
from streamrl.learner.trainers import StepResult
from streamrl.learner.version_writes import VersionWrites
from streamrl.runtime.folders import write_folder
from streamrl.runtime.gpu_model import TwinModel, train_s


class _OneProcess:
    world_size = 1
    device = "modelled"


class ModelledPolicy(SingleProcessPolicy):
    ref_model = None
    tokenizer = None
    placement = _OneProcess()

    def __init__(self, model: TwinModel, checkpoints: Path, logs: Path):
        self.model, self.checkpoints, self.logs = model, checkpoints, logs
        self.checkpoint = latest_checkpoint(checkpoints)
        self.versions = VersionWrites()

    def warm_up(self) -> dict:
        return {"cluster_twin": json.loads(self.model.to_env())}

    def val_accuracy(self) -> float:
        raise RuntimeError("the cluster twin has no model to validate (its recipe validates nothing)")

    def train(self, lr: float, items: list[TrainItem] | None = None) -> StepResult:
        items = items or []
        tokens = sum(len(item.tokens) for item in items)
        started, began = time.perf_counter(), time.time()
        time.sleep(train_s(self.model, tokens))
        seconds = time.perf_counter() - started
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / "learner-twin.jsonl").open("a") as out:
            out.write(json.dumps({"time": began, "seconds": seconds, "tokens": tokens, "samples": len(items)}) + "\n")
        return StepResult(loss=0.0, grad_norm=0.0, tokens=tokens, samples=len(items), seconds=seconds, metrics={})

    def start_version(self, root: Path, version: int) -> None:
        self.versions.done(version, self.write_version(root, version))

    def written_versions(self, wait: bool = False) -> list[tuple[int, Path]]:
        return self.versions.written(wait)

    def write_version(self, root: Path, version: int) -> Path:
        def fill(folder: Path) -> None:
            (folder / "modelled-weights.json").write_text(json.dumps({"version": version}))

        return write_folder(version_folder(root, version), fill)

    def write_checkpoint(self, step: int, state: dict, keep_every: int) -> None:
        save_checkpoint(self.checkpoints, step, None, {}, state, keep_every=keep_every)

    def finish_checkpoint(self, wait: bool) -> bool:
        return True

    def unread_config_keys(self) -> list[str]:
        return []

    def fix_reference(self) -> None:
        raise RuntimeError("the cluster twin has no KL reference")

    def close(self) -> None:
        pass
