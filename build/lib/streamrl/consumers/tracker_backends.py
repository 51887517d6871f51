"""Experiment trackers: W&B, TensorBoard, MLflow, each a small adapter with the same
three calls (`log_config`, `log`, `close`). What is logged is decided in
consumers/tracker.py; here only how each tracker wants it.

Two x-axes, as a run has two clocks: train metrics (`train/...`) are logged against the
step, validation metrics (`val/...`) against the weight version they measured. They
arrive interleaved and out of order (version 0's validation finishes after step 3), so
every backend is given the axis explicitly instead of an implicit "current step".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Protocol

from streamrl.runtime.logger_config import Logger
from streamrl.runtime.settings import Settings

STEP_AXIS = "step"
VERSION_AXIS = "weight_version"


class Tracker(Protocol):
    def __init__(self, settings: Settings, run_id: str, config: dict, logger: Logger) -> None: ...
    def log_config(self, config: dict) -> None: ...
    def log(self, metrics: dict[str, float], axis: str, value: int) -> None: ...
    def close(self) -> None: ...


def tracker_dir(settings: Settings, run_id: str) -> Path:
    """Where the local trackers write by default: $STREAMRL_HOME/trackers/RUN."""
    return settings.home / "trackers" / run_id


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"trainer": {"lr": 1e-5}} -> {"trainer.lr": "1e-05"}: the form flat trackers take."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return flat


class WandbTracker:
    def __init__(self, settings: Settings, run_id: str, config: dict, logger: Logger):
        import wandb

        options = logger.wandb
        key = os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_KEY")  # the guide's name for it
        mode = options.mode if options.mode != "auto" else ("online" if key else "offline")
        if mode == "online" and not key:
            raise RuntimeError("logger.wandb.mode is online but neither WANDB_API_KEY nor WANDB_KEY is set")
        if key:
            os.environ.setdefault("WANDB_API_KEY", key)
        if os.environ.get("WANDB_HOST"):  # the guide's name for a self-hosted W&B server
            os.environ.setdefault("WANDB_BASE_URL", os.environ["WANDB_HOST"])
        folder = Path(options.dir) if options.dir else tracker_dir(settings, run_id)
        folder.mkdir(parents=True, exist_ok=True)
        # The run id is the W&B run id: a restarted tracker, or `streamrl export`, continues
        # the same W&B run instead of starting another.
        self.run = wandb.init(
            project=options.project or config.get("project_name") or "streamrl",
            entity=options.entity or None,
            name=options.name or f"{config.get('experiment_name')}-{run_id}",
            id=run_id,
            resume="allow",
            tags=options.tags or None,
            dir=str(folder),
            mode=mode,
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        for axis, pattern in ((STEP_AXIS, "train/*"), (VERSION_AXIS, "val/*")):
            self.run.define_metric(axis)
            self.run.define_metric(pattern, step_metric=axis)

    def log_config(self, config: dict) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log(self, metrics: dict[str, float], axis: str, value: int) -> None:
        self.run.log({axis: value, **metrics})

    def close(self) -> None:
        self.run.finish()


class TensorboardTracker:
    def __init__(self, settings: Settings, run_id: str, config: dict, logger: Logger):
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(logger.tensorboard.log_dir) if logger.tensorboard.log_dir else tracker_dir(settings, run_id) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(folder))

    def log_config(self, config: dict) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log(self, metrics: dict[str, float], axis: str, value: int) -> None:
        for key, number in metrics.items():  # the tag's own axis: train/* by step, val/* by version
            self.writer.add_scalar(key, number, value)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    """MLflow's local default is a SQLite file (its file store refuses new runs since
    MLflow 3); MLFLOW_TRACKING_URI or `logger.mlflow.tracking_uri` names a server."""

    RUN_TAG = "streamrl.run_id"

    def __init__(self, settings: Settings, run_id: str, config: dict, logger: Logger):
        from mlflow.tracking import MlflowClient

        options = logger.mlflow
        uri = options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            folder = tracker_dir(settings, run_id)
            folder.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{folder / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        name = options.experiment_name or config.get("project_name") or "streamrl"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        # one MLflow run per StreamRL run, found again by its tag (restart, export)
        found = self.client.search_runs([experiment_id], f"tags.`{self.RUN_TAG}` = '{run_id}'", max_results=1)
        self.run_id = (
            found[0].info.run_id
            if found
            else self.client.create_run(
                experiment_id, run_name=f"{config.get('experiment_name')}-{run_id}", tags={self.RUN_TAG: run_id}
            ).info.run_id
        )

    def log_config(self, config: dict) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        params = [Param(key, str(value)[:6000]) for key, value in flatten(config).items() if key not in existing]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, metrics: dict[str, float], axis: str, value: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, float(number), now, value) for key, number in metrics.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, type[Tracker]] = {"wandb": WandbTracker, "tensorboard": TensorboardTracker, "mlflow": MlflowTracker}


def open_trackers(settings: Settings, run_id: str, config: dict, logger: Logger) -> list[Tracker]:
    trackers = []
    for name in logger.trackers():
        tracker = BACKENDS[name](settings, run_id, config, logger)
        tracker.log_config(config)
        trackers.append(tracker)
    return trackers
