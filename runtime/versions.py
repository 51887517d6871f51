"""Weight versions counted in steps: the learner publishes the weights after step s as
version s, every `weight.sync_every` steps and at the last step. Pacing and staleness
count published versions, not steps."""

from __future__ import annotations

from pathlib import Path


def is_version_step(step: int, sync_every: int, total_steps: int) -> bool:
    """Whether the weights after `step` are published as a version."""
    return step % sync_every == 0 or step == total_steps


def newest_version(step: int, sync_every: int) -> int:
    """The newest version published by a learner that has trained `step` steps (the
    run's last step aside, which is always published)."""
    return step - step % sync_every


def versions_behind(learner_step: int, version: int, sync_every: int) -> int:
    """How many published versions `version` is behind the weights after `learner_step`."""
    return newest_version(learner_step, sync_every) // sync_every - version // sync_every


def version_folder(root: Path, version: int) -> Path:
    """Where weight version `version` lives under `root` (the run's weights folder)."""
    return root / f"v{version:06d}"
