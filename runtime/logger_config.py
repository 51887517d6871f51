"""The recipe's `logger:` section: which experiment trackers receive the run's metrics.

The guide's form names one backend (`logger.backend: wandb` with a `logger.wandb:`
block); `logger.backends: [wandb, tensorboard, mlflow]` names any subset. Either way the
trackers are fed by `streamrl tracker RUN` from the run's events, never by the learner,
so a tracker that is slow or down cannot stall training (consumers/tracker.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TRACKERS = ("wandb", "tensorboard", "mlflow")


@dataclass
class WandbOptions:
    project: str = ""  # default: the recipe's project_name
    name: str = ""  # default: the recipe's experiment_name and the run id
    entity: str = ""
    tags: list[str] = field(default_factory=list)
    # auto: online with an API key (WANDB_API_KEY, or the guide's WANDB_KEY), else offline files
    mode: Literal["auto", "online", "offline"] = "auto"
    dir: str = ""  # default: $STREAMRL_HOME/trackers/RUN


@dataclass
class TensorboardOptions:
    log_dir: str = ""  # default: $STREAMRL_HOME/trackers/RUN/tensorboard


@dataclass
class MlflowOptions:
    tracking_uri: str = ""  # default: a file store in $STREAMRL_HOME/trackers/RUN/mlruns (or MLFLOW_TRACKING_URI)
    experiment_name: str = ""  # default: the recipe's project_name


@dataclass
class Logger:
    backend: Literal["console", "wandb", "tensorboard", "mlflow"] = "console"  # the guide's single backend
    backends: list[Literal["wandb", "tensorboard", "mlflow"]] = field(default_factory=list)
    wandb: WandbOptions = field(default_factory=WandbOptions)
    tensorboard: TensorboardOptions = field(default_factory=TensorboardOptions)
    mlflow: MlflowOptions = field(default_factory=MlflowOptions)

    def trackers(self) -> list[str]:
        """The trackers this recipe feeds (console alone: none), each once, in a fixed order."""
        chosen = set(self.backends) | ({self.backend} - {"console"})
        return [name for name in TRACKERS if name in chosen]
