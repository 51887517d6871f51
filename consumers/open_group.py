"""A group still collecting its rollouts, as both stream processors keep it (the plain
loop, consumers/processor.py, and the faust app, consumers/faust_processor.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from streamrl.schema.events import Evaluation, Trajectory


@dataclass
class OpenGroup:
    step: int
    group_size: int = 0  # from its trajectories (an evaluation does not carry it)
    partition: int = -1  # the input partition its events come on (the faust app's timer checks it is still ours)
    first_seen: float = field(default_factory=time.monotonic)
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    evaluations: dict[str, Evaluation] = field(default_factory=dict)
    # what the processor releases once the group's outcome is delivered: the plain loop's
    # (partition, offset) pairs, the faust app's stream events to ack
    held: list = field(default_factory=list)

    def add(self, event: Trajectory | Evaluation, hold) -> None:
        """The event joins the group (the first copy of a trajectory or evaluation wins,
        as in the ledger), and `hold` is kept until the group is released."""
        if isinstance(event, Trajectory):
            self.group_size = event.group_size
            self.trajectories.setdefault(event.trajectory_id, event)
        else:
            self.evaluations.setdefault(event.trajectory_id, event)
        self.held.append(hold)

    def joined(self) -> list[tuple[Trajectory, Evaluation]]:
        """Each trajectory whose evaluation has arrived, with it, by trajectory id."""
        return [(t, self.evaluations[tid]) for tid, t in sorted(self.trajectories.items()) if tid in self.evaluations]

    def complete(self) -> bool:
        return bool(self.group_size) and len(self.joined()) >= self.group_size
