"""Creating a run's topics: the plain ones when the run is published, a window's when
its first event is (schema/topics.py)."""

from __future__ import annotations

import logging
import time

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from streamrl.runtime.settings import Settings
from streamrl.schema.topics import (
    BROKER_WINDOWS,
    ROTATED_KINDS,
    WRITTEN_WINDOWS,
    existing_run_windows,
    run_topics,
    window_topic,
)

log = logging.getLogger("streamrl.topic_admin")


def create_topics(
    settings: Settings, names: list[str], partitions: int | None = None, configs: dict[str, str] | None = None
) -> list[str]:
    """Create the topics that do not exist yet (with the topic `configs`, e.g.
    retention.ms); returns the names created."""
    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        existing = set(admin.list_topics())
        missing = [n for n in names if n not in existing]
        created = []
        for name in missing:
            try:
                admin.create_topics([NewTopic(name, partitions or settings.topic_partitions, 1, topic_configs=configs or {})])
                created.append(name)
            except TopicAlreadyExistsError:  # another process won the race
                pass
        return created
    finally:
        admin.close()


def create_run_topics(
    settings: Settings, run_id: str, partitions: int | None = None, configs: dict[str, str] | None = None
) -> list[str]:
    return create_topics(settings, list(run_topics(run_id).values()), partitions, configs)


def create_window_topics(settings: Settings, run_id: str, window: int, partitions: int) -> list[str]:
    """Create a step window's topics of a rotating run (schema/topics.py)."""
    return create_topics(settings, [window_topic(run_id, kind, window) for kind in ROTATED_KINDS], partitions)


def broker_windows(settings: Settings, run_id: str) -> set[int]:
    """The windows of the run whose topics the broker lists."""
    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        return existing_run_windows(run_id, admin.list_topics())
    finally:
        admin.close()


# How often a paced publisher asks the broker whether a window has left it.
ROOM_POLL_S = 0.5


def wait_for_room(settings: Settings, run_id: str, opening: set[int]) -> bool:
    """Wait until the broker holds at most `BROKER_WINDOWS` of the run's windows with
    `opening` among them: the ledger sink retires the oldest (runtime/topic_windows.py).
    Whether it waited; past `STREAMRL_SERVICE_WAIT_S`, a RuntimeError says what the
    broker still holds."""
    deadline = time.monotonic() + settings.service_wait_s
    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        listed, waited = existing_run_windows(run_id, admin.list_topics()), False
        while len(listed | opening) > BROKER_WINDOWS:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"run {run_id}: the broker still holds its topic windows {sorted(listed)} after "
                    f"{settings.service_wait_s} s (STREAMRL_SERVICE_WAIT_S), and a run holds at most {BROKER_WINDOWS}: "
                    "the ledger sink retires a window once the ledger holds its records and the learner's snapshot "
                    "(trainer.save_freq) is past it; is the sink running (streamrl status)?"
                )
            time.sleep(ROOM_POLL_S)
            listed, waited = existing_run_windows(run_id, admin.list_topics()), True
        return waited
    finally:
        admin.close()


def track_topic(producer, topic: str) -> None:
    """Have the producer's metadata follow `topic`. kafka-python adds a topic to the ones
    it asks the broker about only when a send finds none of its metadata cached, and each
    answer replaces the cache whole. A topic first found in the cache (the client's
    bootstrap asks about every topic) is then dropped by the next refresh, which asks
    about the others only; from then on its partitions have no known leader, and the
    producer's sender thread spins asking for metadata until the topic is sent to again
    (measured: 40 ms of CPU a step in the publisher of a run with topic windows). Asking
    for the topic by name keeps it in every refresh."""
    producer._metadata.add_topic(topic)  # the client's metadata, which KafkaProducer does not expose


# How often a publisher makes sure an older window's topics exist before writing to it.
WINDOW_RECHECK_S = 5.0


class WindowTopics:
    """A publisher's windows of rotating runs: made on the first event for each, and made
    again for a straggler's event to an older window, which may have been retired since
    (checked at most every `WINDOW_RECHECK_S`).

    It also says when the publisher's producer must be replaced. A Kafka producer keeps
    every partition it ever wrote to: once such a topic is deleted, its sender thread
    finds a partition with no leader on every pass and spins, asking the broker for
    metadata (which the embedded broker answers by making the topic again: it ignores
    allow_auto_topic_creation). So a producer that has written to a window older than the
    `WRITTEN_WINDOWS` newest this publisher opened is replaced by a fresh one, before the
    window can be retired (retirement waits for HELD_WINDOWS newer ones).

    `paced`: before it makes a new window ahead, wait until the broker has room for it
    (`wait_for_room`). The run's task publisher is paced (and a replay's, where its
    rollouts start): every other event of a step follows its tasks, so the broker never
    holds more than `BROKER_WINDOWS` of the run's windows however far the ledger sink
    falls behind; the run waits for it instead."""

    def __init__(self, settings: Settings, paced: bool = False):
        self.settings = settings
        self.paced = paced
        self.waited = False  # said once that the broker had no room
        self.ensured: dict[tuple[str, int], float] = {}  # (run id, window) -> when its topics were made sure of
        self.newest: dict[str, int] = {}
        self.written: set[tuple[str, int]] = set()  # what the current producer wrote to

    def open(self, run_id: str, window: int, partitions) -> bool:
        """Make sure the window's topics exist (`partitions()`: how many each gets);
        True when the producer must be replaced before this event is sent."""
        ensured = self.ensured.get((run_id, window))
        newest = max(window, self.newest.get(run_id, -1))
        if ensured is None or (window < newest and time.monotonic() - ensured >= WINDOW_RECHECK_S):
            # the next window too, so that its readers hold it before its first event
            ahead = [window + 1] if window == newest else []
            waited = bool(ahead) and self.paced and wait_for_room(self.settings, run_id, {window, *ahead})
            if waited and not self.waited:
                self.waited = True
                log.warning(
                    "run %s: window %d waited for the ledger sink to retire an older one (the broker holds at most "
                    "%d of a run's windows); said once: a run that waits often has a sink slower than its steps",
                    run_id,
                    window + 1,
                    BROKER_WINDOWS,
                )
            for made in [window, *ahead]:
                create_window_topics(self.settings, run_id, made, partitions() or self.settings.topic_partitions)
            self.ensured[(run_id, window)] = time.monotonic()
        self.newest[run_id] = newest
        stale = any(w < self.newest[r] - WRITTEN_WINDOWS + 1 for r, w in self.written)
        if stale:
            self.written.clear()
        self.written.add((run_id, window))
        return stale
