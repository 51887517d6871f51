"""A long run's topics, retired window by window while it trains.

With `service.broker.window_steps: W`, the events of step s of the kinds that grow with
the run go to window s // W's topics (schema/topics.py). Window w holds steps
wW .. (w+1)W - 1. It leaves the broker when all of these hold:

- the learner's newest snapshot is of a step at or past the window's last step. A
  restarted learner re-reads samples from its snapshot's offsets on, and the steps it
  re-trains are all later;
- window w + HELD_WINDOWS exists, so the other readers (processor, workers, tracker),
  which hold the newest HELD_WINDOWS windows (the newest made ahead of its first
  event), have let go of it. Every step those windows do not cover has been trained;
- both have been true for `SETTLE_S`, so every reader has looked again since (they
  look every second);
- the ledger holds every record of the window's topics.

The broker holds at most `BROKER_WINDOWS` of a run's windows: the run's task publisher
waits for the sink before it opens another (runtime/topic_admin.py `wait_for_room`).

The ledger sink retires windows (`consumers/ledger_sink.py`), because it must let go of a
window's partitions itself before they are deleted. The embedded broker makes again any
topic a client asks about, whatever allow_auto_topic_creation says, and a consumer
asks about the partitions it holds. Publishers replace their producer for the same
reason (runtime/topic_admin.py WindowTopics).

A straggler may write to a retired window later, for example a rollout that outlived its
group's timeout. Its publisher makes the topics again, the sink writes the event to the
ledger from offset 0, and the window is retired again. Nothing is lost, and nothing is
written twice, because the ledger keeps the first copy of an event id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka import KafkaAdminClient, TopicPartition

from streamrl.runtime.db import connect
from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_admin import broker_windows
from streamrl.runtime.topic_retention import delete_and_wait, ledger_positions, records_past
from streamrl.schema.topics import HELD_WINDOWS, parse_topic, topic_window

# How long a window stays eligible before it goes: readers look again every second.
SETTLE_S = 3.0
# How often the sink looks for windows to retire.
RETIRE_EVERY_S = 2.0


def window_closed(window: int, window_steps: int, snapshot: int | None, windows_seen: set[int]) -> bool:
    """Whether no reader needs the window any more (its records aside): the learner's
    snapshot is past its last step and the readers' hold has moved past it."""
    return snapshot is not None and (window + 1) * window_steps - 1 <= snapshot and window + HELD_WINDOWS in windows_seen


@dataclass
class SinkWindows:
    """What the ledger sink knows of the rotating runs' windows it reads."""

    first_seen: dict[str, set[int]] = field(default_factory=dict)  # run id -> windows seen on the broker
    closed_since: dict[tuple[str, int], float] = field(default_factory=dict)
    window_steps: dict[str, int] = field(default_factory=dict)
    retired: dict[str, list[int]] = field(default_factory=dict)
    last_pass: float = 0.0

    def observe(self, topics) -> None:
        for topic in topics:
            window, parsed = topic_window(topic), parse_topic(topic)
            if window is not None and parsed is not None:
                self.first_seen.setdefault(parsed[0], set()).add(window)

    def due(self, conn, now: float) -> list[tuple[str, int]]:
        """(run id, window) of the windows closed for `SETTLE_S`, oldest first."""
        due = []
        for run_id, seen in self.first_seen.items():
            steps = self.steps_of(conn, run_id)
            if steps is None:
                continue
            snapshot = conn.execute(
                "select max(coalesce((details->>'groups_through')::int, sequence)) from run_events "
                "where run_id = %s and kind = 'snapshot'",
                (run_id,),
            ).fetchone()[0]
            for window in sorted(seen):
                if not window_closed(window, steps, snapshot, seen):
                    break
                since = self.closed_since.setdefault((run_id, window), now)
                if now - since >= SETTLE_S:
                    due.append((run_id, window))
        return due

    def steps_of(self, conn, run_id: str) -> int | None:
        if run_id not in self.window_steps:
            row = conn.execute(
                "select (config->'service'->'broker'->>'window_steps')::int from runs where run_id = %s", (run_id,)
            ).fetchone()
            if row is None or row[0] is None:
                return None  # not created yet in the ledger, or it does not rotate
            self.window_steps[run_id] = row[0]
        return self.window_steps[run_id]

    def forget(self, run_id: str, window: int) -> None:
        self.first_seen.get(run_id, set()).discard(window)
        self.closed_since.pop((run_id, window), None)
        self.retired.setdefault(run_id, []).append(window)


def ledger_holds(settings: Settings, partitions: list[TopicPartition]) -> bool:
    """Whether the ledger holds every record of these partitions."""
    topics = sorted({tp.topic for tp in partitions})
    return not records_past(settings, ledger_positions(settings, topics), partitions, quiet_polls=1)


def delete_topics(settings: Settings, topics: list[str]) -> None:
    """Delete `topics`, wait until the broker no longer lists them, and forget the sink's
    positions in them (a topic made again under the same name starts at offset 0)."""
    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        delete_and_wait(admin, topics)
    finally:
        admin.close()
    with connect(settings.database_url, autocommit=True) as conn:
        conn.execute("delete from consumer_offsets where topic = any(%s)", (topics,))


def windows_left(settings: Settings, run_id: str, steps: int, window_steps: int) -> str:
    """What a finished rotating run left on the broker, in a sentence."""
    left = broker_windows(settings, run_id)
    opened = steps // window_steps + 2  # the last step's window and the one made ahead of it
    return (
        f"{opened - len(left)} of run {run_id}'s {opened} topic windows ({window_steps} steps each) left the "
        f"broker while it trained; {len(left)} remained at its end"
    )
