"""What a weight version must be before a reader acts on it.

A signed frame (schema/signing.py) says that one of the run's own processes wrote an
event. A weight version says more: which weights every later rollout samples with. So
a reader checks what only the run's learner can say:

- its number is one the learner publishes (version 0, a multiple of
  `weight.sync_every`, or the last step), no further than the last step, and, for a
  reader that follows the sequence, the next one after the newest it accepted;
- its folder is the run's own: `<weight.sync_weight_path>/<run>/v<version>` (version 0
  may be the model folder itself, where the learner announces it as it is);
- a broadcast version only where the recipe broadcasts (`weight.transport: distributed`),
  any other one with the sha256 of its folder, which a worker checks before it loads it.

A version that fails is refused (WeightVersionRefused, the reader dead-letters it).
docs/decisions.md, "Trust on the bus", says what this does and does not guard against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from streamrl.runtime.dataset import total_train_steps
from streamrl.runtime.folders import directory_sha256, run_dir
from streamrl.runtime.versions import is_version_step, newest_version, version_folder
from streamrl.schema.events import WeightVersion


class WeightVersionRefused(ValueError):
    """A weight version a reader will not use, with the reason."""


def next_version(version: int, sync_every: int, total_steps: int) -> int | None:
    """The version the learner publishes after `version`; None after the last step."""
    if version >= total_steps:
        return None
    return min(newest_version(version, sync_every) + sync_every, total_steps)


@dataclass(frozen=True)
class VersionRules:
    """What the run's recipe says its learner's versions are."""

    weights_root: Path  # the run's own weights folder
    model_folder: Path | None  # version 0 may be announced where it is
    sync_every: int
    total_steps: int | None  # None: not known to this reader (no upper bound checked)
    broadcast: bool

    @classmethod
    def of(cls, home: Path, run_id: str, recipe, total_steps: int | None) -> VersionRules:
        model = recipe.rollout_worker.model_path
        return cls(
            weights_root=run_dir(home, run_id, recipe.weight.sync_weight_path).resolve(),
            model_folder=Path(model).resolve() if model else None,
            sync_every=recipe.weight.sync_every,
            total_steps=total_steps,
            broadcast=recipe.weight.transport == "distributed",
        )

    def problem(self, event: WeightVersion) -> str | None:
        """Why `event` cannot be this run's learner's, or None (number, folder, form)."""
        version, last = event.version, self.total_steps
        if version < 0 or (last is not None and version > last):
            return f"weight version {version}: outside 0..{last}, the run's steps"
        if last is not None and not is_version_step(version, self.sync_every, last):
            return f"weight version {version}: not one the learner publishes (weight.sync_every {self.sync_every})"
        folder = Path(event.uri).resolve() if event.uri else None
        allowed = [version_folder(self.weights_root, version)]
        if version == 0 and self.model_folder is not None:
            allowed.append(self.model_folder)
        if folder not in allowed:
            return f"weight version {version} at {event.uri!r}: not the run's folder for it ({allowed[0]})"
        if event.broadcast is not None and not self.broadcast:
            return f"weight version {version}: a broadcast, but the run's weight.transport is not distributed"
        if event.broadcast is None and not event.sha256:
            return f"weight version {version}: no sha256 of its folder"
        return None


@dataclass
class VersionSequence:
    """A reader that follows the weights topic in order: the versions it accepted."""

    rules: VersionRules
    accepted: WeightVersion | None = None

    def offer(self, event: WeightVersion) -> bool:
        """Whether `event` is the new newest version (False: one already accepted, or an
        older one, announced again after a restart). WeightVersionRefused if it is not the
        learner's next."""
        problem = self.rules.problem(event)
        if problem:
            raise WeightVersionRefused(problem)
        newest = self.accepted.version if self.accepted is not None else None
        if newest is not None and event.version <= newest:
            return False
        if newest is not None and self.rules.total_steps is not None:
            expected = next_version(newest, self.rules.sync_every, self.rules.total_steps)
            if event.version != expected:
                raise WeightVersionRefused(
                    f"weight version {event.version}: out of sequence, the learner's next after {newest} is {expected}"
                )
        self.accepted = event
        return True

    def withdraw(self, event: WeightVersion, previous: WeightVersion | None) -> None:
        """`event` was refused when it was loaded: `previous` is the newest again, so that
        the learner's own version of that number is taken when it comes."""
        if self.accepted is event:
            self.accepted = previous


def check_folder(event: WeightVersion) -> None:
    """Before loading: the folder holds the weights the version announced
    (WeightVersionRefused otherwise). A broadcast version is sent, not read."""
    if event.broadcast is not None:
        return
    folder = Path(event.uri)
    if not folder.is_dir():
        raise WeightVersionRefused(f"weight version {event.version}: its folder {folder} does not exist")
    found = directory_sha256(folder)
    if found != event.sha256:
        raise WeightVersionRefused(
            f"weight version {event.version}: its folder {folder} hashes to {found[:16]}..., "
            f"not the announced {event.sha256[:16]}..."
        )


def known_total_steps(recipe) -> int | None:
    """The run's last step, where a reader can know it (with `trainer.total_epochs` it
    depends on the data's rows, which a reader without the data files cannot count)."""
    if not recipe.trainer.total_epochs:
        return recipe.total_train_steps(0)
    try:
        return total_train_steps(recipe)
    except (OSError, ValueError):
        return None
