"""The recipe's `logger:` section: which experiment trackers receive the run's metrics.

The guide's form names one backend (`logger.backend: wandb` with a `logger.wandb:`
block); `logger.backends: [wandb, tensorboard, mlflow]` names any subset. Either way the
trackers are fed by `streamrl tracker RUN` from the run's events, never by the learner,
so a tracker that is slow or down cannot stall training (consumers/tracker.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streamrl.runtime.config_fields import knob

TRACKERS = ("wandb", "tensorboard", "mlflow")


@dataclass
class WandbOptions:
    project: str = knob("", "default: the recipe's project_name")
    name: str = knob("", "default: the recipe's experiment_name and the run id")
    entity: str = knob("", "the W&B entity (team or user)")
    tags: list[str] = knob(help="the run's W&B tags", factory=list)
    mode: Literal["auto", "online", "offline"] = knob(
        "auto", "auto: online with an API key (WANDB_API_KEY, or the guide's WANDB_KEY), else offline files"
    )
    dir: str = knob("", "default: $STREAMRL_HOME/trackers/RUN")


@dataclass
class TensorboardOptions:
    log_dir: str = knob("", "default: $STREAMRL_HOME/trackers/RUN/tensorboard")


@dataclass
class MlflowOptions:
    tracking_uri: str = knob("", "default: a file store in $STREAMRL_HOME/trackers/RUN (or MLFLOW_TRACKING_URI)")
    experiment_name: str = knob("", "default: the recipe's project_name")


@dataclass
class Logger:
    backend: Literal["console", "wandb", "tensorboard", "mlflow"] = knob("console", "the guide's single backend")
    backends: list[Literal["wandb", "tensorboard", "mlflow"]] = knob(help="any of the trackers", factory=list)
    wandb: WandbOptions = knob(help="W&B options", factory=WandbOptions)
    tensorboard: TensorboardOptions = knob(help="TensorBoard options", factory=TensorboardOptions)
    mlflow: MlflowOptions = knob(help="MLflow options", factory=MlflowOptions)

    def trackers(self) -> list[str]:
        """The trackers this recipe feeds (console alone: none), each once, in a fixed order."""
        chosen = set(self.backends) | ({self.backend} - {"console"})
        return [name for name in TRACKERS if name in chosen]
