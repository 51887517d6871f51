"""A worker's view of its run's weights topic: the newest version its learner announced,
and the ones refused as forged or out of sequence (dead letters for the worker to publish)."""

from __future__ import annotations

import threading
from collections import deque

from kafka import TopicPartition

from streamrl.runtime.bus import RunReader
from streamrl.runtime.dead_letters import refused_event
from streamrl.runtime.settings import Settings
from streamrl.runtime.weight_trust import VersionRules, VersionSequence, WeightVersionRefused
from streamrl.schema.events import DeadLetter, WeightVersion


class WeightWatcher:
    """Follows the run's weights topic; knows the newest version its learner announced.
    A version that cannot be the learner's (runtime/weight_trust.py) is refused: kept in
    `refused` as a dead letter for the worker to publish, and never loaded."""

    def __init__(self, settings: Settings, run_id: str, rules: VersionRules):
        self.reader = RunReader(settings, run_id, ["weights"], group_id=None, stage="worker")
        self.sequence = VersionSequence(rules)
        self.refused: deque[DeadLetter] = deque()  # appended by the thread that polls, taken by the worker's loop
        # version -> where it was read and the version before it, for the accepted ones not yet loaded
        self._read_at: dict[int, tuple[TopicPartition, int, WeightVersion | None]] = {}

    def poll(self, timeout_ms: int = 0) -> WeightVersion | None:
        events, dead = self.reader.poll(timeout_ms=timeout_ms)
        self.refused.extend(dead)
        for event, tp, offset in events:
            if not isinstance(event, WeightVersion):
                continue
            before = self.sequence.accepted
            try:
                if self.sequence.offer(event):
                    self._read_at[event.version] = (tp, offset, before)
            except WeightVersionRefused as exc:
                self.refused.append(refused_event(event, tp.topic, tp.partition, offset, str(exc), "worker"))
        return self.sequence.accepted

    def refuse(self, event: WeightVersion, reason: str) -> None:
        """`event` failed its check at loading: a dead letter, and the version before it is
        the newest again."""
        tp, offset, before = self._read_at.pop(event.version)
        self.refused.append(refused_event(event, tp.topic, tp.partition, offset, reason, "worker"))
        self.sequence.withdraw(event, before)

    def loaded(self, version: int) -> None:
        """`version` is in the engine: it and the ones before it can no longer be refused."""
        for number in [n for n in self._read_at if n <= version]:
            del self._read_at[number]

    def wait_for(self, version: int, stop: threading.Event) -> WeightVersion | None:
        while not stop.is_set():
            latest = self.poll(timeout_ms=100)
            if latest is not None and latest.version >= version:
                return latest
        return None

    def take_refused(self) -> list[DeadLetter]:
        taken = []
        while self.refused:
            taken.append(self.refused.popleft())
        return taken
