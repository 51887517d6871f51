"""StreamRL: event-sourced RL post-training for LLMs.

    import streamrl

    result = streamrl.train("builtin:arith", overrides={"trainer.total_train_steps": 50})
    print(result.run_id, result.val_accuracy)

`streamrl.train` runs what `streamrl run` runs (the services, the ledger sink, stream
processor, learner, rollout workers and publisher as processes of this machine) and
returns when the run has finished. A recipe's own code imports from `streamrl.api`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamrl.report import RunSummary

# A run's processes share the machine's cores with each other (and a test suite's runs
# with each other's). OpenMP threads that spin while they wait, libgomp's default, take
# the cores the others need. Set before torch loads libgomp, which is when it is read;
# the measurement is in docs/benchmarks.md ("Waiting threads").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["TrainResult", "train"]


@dataclass(frozen=True)
class TrainResult:
    """A finished run: its id (the ledger's key: `streamrl show RUN`, `streamrl sql`) and
    the summary `streamrl run` prints."""

    run_id: str
    summary: RunSummary

    @property
    def val_accuracy(self) -> float | None:
        """The held-out accuracy of the last validation, or None when none was scored."""
        return self.summary.val_accuracy[-1] if self.summary.val_accuracy else None


def override_strings(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """`{"trainer.lr": 1e-5}` or `["trainer.lr=1e-5"]` -> the CLI's `key=value` words (a
    value that is not a string is written as JSON, which the recipe reader parses as YAML)."""
    import json

    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise TypeError("overrides: a mapping or a list of 'key=value' strings, not one string")
    if isinstance(overrides, Mapping):
        return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in overrides.items()]
    return [str(item) for item in overrides]


def train(
    recipe: str | Path,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    *,
    run_id: str | None = None,
    workers: int | None = None,
    out: str | Path | None = None,
    tag: str | None = None,
    max_restarts: int = 5,
    restart_window_s: float = 600.0,
) -> TrainResult:
    """Train `recipe` (a recipe YAML, or `builtin:NAME`) end to end on this machine, as
    `streamrl run RECIPE OVERRIDES...` does, and return its run id and summary. A recipe
    that is refused raises the error `streamrl run` would print; a run that fails raises
    it with the run's failure."""
    from streamrl.cli.train_cmd import run_recipe

    finished = run_recipe(
        Path(recipe),
        override_strings(overrides),
        run=run_id,
        workers=workers,
        out=Path(out) if out is not None else None,
        max_restarts=max_restarts,
        restart_window=restart_window_s,
        tag=tag,
    )
    if finished is None:  # only the guide's `-c FILE` without `-r` returns nothing; not asked for here
        raise RuntimeError(f"{recipe}: the run did not start")
    return TrainResult(*finished)
