"""The ledger sink: every topic of every run (or of one run) into PostgreSQL.

A thin loop:  poll a batch -> decode -> one database transaction (rows + consumed
offsets) -> commit the offsets to Kafka too.

Exactly-once effects: the rows and the next offset of every partition are written in
one transaction (table `consumer_offsets`), and a restarted sink seeks to those
offsets. Rows are also inserted with `ON CONFLICT (event_id) DO NOTHING`, so a message
read twice for any other reason (the same event published again, a second sink) changes
nothing. Offsets go to Kafka under the group id only after the database commit, so
standard lag tooling sees the sink's progress.

Partitions are assigned explicitly (all partitions of the matching topics, or a
`shard` of them when several sinks share the work), not by the broker's group
coordinator: the embedded broker's coordinator was seen to wedge a group for good after
a member was killed mid-rebalance, and the ledger's offsets make membership unneeded.
Messages that cannot be decoded (or whose event does not belong to
the topic it came on) become DeadLetter rows and events, and the sink goes on.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import psycopg
from kafka import OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError

from streamrl.consumers.ledger_writes import SINK_STAGE, Placed, create_staging_tables, load_offsets, write_batch
from streamrl.consumers.sample_arrays import TrajectoryArrays
from streamrl.runtime.backoff import backoff_delay
from streamrl.runtime.blobs import BlobMissing, PostgresBlobStore
from streamrl.runtime.bus import IDLE_FETCH_WAIT_MS, EventPublisher, make_consumer, open_frame
from streamrl.runtime.config import Recipe
from streamrl.runtime.db import connect
from streamrl.runtime.dead_letters import dead_letter
from streamrl.runtime.outage import BrokerWatch, PostgresOutage
from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_admin import create_topics
from streamrl.runtime.topic_windows import RETIRE_EVERY_S, SinkWindows, delete_topics, ledger_holds
from streamrl.runtime.weight_trust import VersionRules, VersionSequence, WeightVersionRefused, known_total_steps
from streamrl.schema.codec import CodecError, split_bundle
from streamrl.schema.events import DeadLetter, Event, WeightVersion
from streamrl.schema.ledger import query_events
from streamrl.schema.topics import all_runs_pattern, parse_topic, run_pattern, topic_name, topic_window

# How long a stopping sink keeps writing what is left on the topics.
DRAIN_S = 10.0
log = logging.getLogger("streamrl.ledger_sink")

SINK_GROUP = "streamrl-ledger"


@dataclass
class SinkStats:
    rows: int = 0
    dead_letters: int = 0
    batches: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


def decode_record(record, blobs, bus_key: bytes | None = None) -> tuple[list[Event], list[DeadLetter]]:
    """The events in a consumer record (one, or a bundle's) and, if some frame is not an
    event of this topic's (or, with a bus key, not signed with its run's key), one dead
    letter keeping the record with the reasons."""
    parsed = parse_topic(record.topic)
    try:
        frames = split_bundle(record.value)
    except CodecError as exc:
        return [], [undecodable(record, str(exc))]
    events, errors = [], []
    for index, value in enumerate(frames):
        try:
            events.append(open_frame(value, parsed, "unknown", blobs, bus_key))
        except (CodecError, BlobMissing) as exc:
            errors.append(str(exc) if len(frames) == 1 else f"bundle frame {index}: {exc}")
    return events, [undecodable(record, "; ".join(errors))] if errors else []


def undecodable(record, error: str) -> DeadLetter:
    parsed = parse_topic(record.topic)
    return dead_letter(record, parsed[0] if parsed else "unknown", error, SINK_STAGE)


class LedgerSink:
    """Owns the consumer, the database connection and the dead-letter producer."""

    def __init__(
        self,
        settings: Settings,
        run_id: str | None = None,
        max_batch: int = 2000,
        group_id: str = SINK_GROUP,
        shard: tuple[int, int] = (0, 1),
        stop: threading.Event | None = None,
    ):
        self.settings = settings
        self.max_batch = max_batch
        self.group_id = group_id
        self.shard = shard
        self.topic_pattern = re.compile(run_pattern(run_id) if run_id else all_runs_pattern())
        self.conn: psycopg.Connection[Any] | None = None
        self._connect()
        self.consumer = make_consumer(settings, group_id, fetch_max_wait_ms=IDLE_FETCH_WAIT_MS)  # the ledger can wait
        self.publisher = EventPublisher(settings, stage="sink")
        self.arrays = TrajectoryArrays()  # whose samples are stored without their arrays
        self.stop_requested = stop or threading.Event()
        self.outage = PostgresOutage(settings, run_id, self.stop_requested)
        # a run's sink watches its runs topic: gone or made again, the broker lost the run
        watched = [topic_name(run_id, "runs")] if run_id else []
        self.broker_watch = BrokerWatch(settings, self.consumer, run_id, watched, exist=False)
        self.stats = SinkStats()
        self._dead_letter_topics: set[str] = set()
        self.windows = SinkWindows()  # rotating runs' windows, retired here (runtime/topic_windows.py)
        self._versions: dict[str, VersionSequence | None] = {}  # run id -> its learner's versions so far

    def _connect(self) -> None:
        """(Re)open the ledger connection. After a lost connection the partitions are
        re-read from the offsets the ledger holds: the batch in hand was rolled back."""
        self._disconnect()
        self.conn = connect(self.settings.database_url, autocommit=True)
        create_staging_tables(self.conn)
        self.blobs = PostgresBlobStore(self.conn)
        self.positions: dict[TopicPartition, int] = {}  # next offset to read, per partition
        self._last_refresh = 0.0

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The open ledger connection (between _connect and a lost connection)."""
        if self.conn is None:
            raise psycopg.OperationalError("the ledger connection is closed")
        return self.conn

    def _disconnect(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
            self.conn = None

    def owns(self, tp: TopicPartition) -> bool:
        index, count = self.shard
        return zlib.crc32(f"{tp.topic}:{tp.partition}".encode()) % count == index

    refresh_every_s = 2.0  # how often the sink lists the broker's topics for new ones

    def refresh_assignment(self, every_s: float | None = None) -> None:
        """Pick up partitions of new matching topics, starting where the ledger says."""
        if time.monotonic() - self._last_refresh < (self.refresh_every_s if every_s is None else every_s):
            return
        self._last_refresh = time.monotonic()
        listed = [topic for topic in self.consumer.topics() if self.topic_pattern.match(topic)]
        self.windows.observe(listed)
        wanted = {TopicPartition(topic, p) for topic in listed for p in (self.consumer.partitions_for_topic(topic) or ())}
        wanted = {tp for tp in wanted if self.owns(tp)}
        if wanted == self.positions.keys():
            return
        for tp in self.positions.keys() - wanted:  # a retired window's topic (runtime/topic_windows.py)
            del self.positions[tp]
        stored = load_offsets(self.connection, self.group_id)
        for tp in wanted - self.positions.keys():
            self.positions[tp] = stored.get(tp, 0)
        self.consumer.assign(sorted(self.positions, key=lambda tp: (tp.topic, tp.partition)))
        for tp, offset in self.positions.items():
            self.consumer.seek(tp, offset)

    def poll_once(self, timeout_ms: int = 500) -> int:
        """One batch: decode, write rows and offsets, publish dead letters, commit to Kafka.
        Returns the number of records seen."""
        self.refresh_assignment()
        if not self.positions:
            time.sleep(timeout_ms / 1000)
            return 0
        batch = self.consumer.poll(timeout_ms=timeout_ms, max_records=self.max_batch)
        if not batch:
            return 0
        placed, dead, next_offsets = [], [], {}
        for tp, records in batch.items():
            for record in records:
                events, bad = decode_record(record, self.blobs, self.settings.bus_key)
                for event in events:
                    problem = self._version_problem(event) if isinstance(event, WeightVersion) else None
                    if problem:
                        bad.append(undecodable(record, f"refused: {problem}"))
                    else:
                        placed.append(Placed(event, record.topic, record.partition, record.offset))
                dead += bad
            next_offsets[tp] = records[-1].offset + 1
        dead = write_batch(self.connection, placed, dead, self.group_id, next_offsets, self.arrays)
        self.positions.update(next_offsets)
        self._publish_dead_letters(dead)
        try:
            self.consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in next_offsets.items()})
        except KafkaError as exc:
            # The ledger holds the authoritative offsets; Kafka's copy is for lag tooling.
            log.warning("could not commit offsets to Kafka (ledger has them): %s", exc)
        count = sum(len(r) for r in batch.values())
        self._count(placed, dead)
        return count

    def _version_problem(self, event: WeightVersion) -> str | None:
        """Why a weight version cannot be its run's learner's (runtime/weight_trust.py:
        number, sequence and folder; the workers check its hash too), or None. A run's
        versions share a partition, so the sink reads them in order. Unchecked while the
        ledger has not yet got the run's recipe, and for a run without one (a demo's)."""
        if event.run_id not in self._versions:
            row = self.connection.execute("select config from runs where run_id = %s", (event.run_id,)).fetchone()
            if not row or not row[0]:
                return None
            self._versions[event.run_id] = self._version_sequence(event.run_id, row[0])
        versions = self._versions[event.run_id]
        if versions is None:
            return None
        try:
            versions.offer(event)  # False for one announced again: its content is checked as it is written
        except WeightVersionRefused as exc:
            return str(exc)
        return None

    def _version_sequence(self, run_id: str, config: dict) -> VersionSequence | None:
        """The run's versions as its learner announces them, from the newest the ledger holds."""
        try:
            recipe = Recipe.recorded(config)
        except ValueError:  # ConfigError: not a recipe (synthetic events)
            return None
        newest = query_events(
            self.connection,
            WeightVersion,
            "select * from weight_versions where run_id = %s order by version desc limit 1",
            (run_id,),
        )
        rules = VersionRules.of(self.settings.home, run_id, recipe, known_total_steps(recipe))
        return VersionSequence(rules, newest[0] if newest else None)

    def _publish_dead_letters(self, dead: list[DeadLetter]) -> None:
        if not dead:
            return
        topics = {topic_name(d.run_id, "dead_letters") for d in dead if d.run_id != "unknown"}
        if topics - self._dead_letter_topics:
            create_topics(self.settings, sorted(topics - self._dead_letter_topics))
            self._dead_letter_topics |= topics
        for d in dead:
            if d.run_id != "unknown" and d.source_topic != topic_name(d.run_id, "dead_letters"):
                self.publisher.publish(d)
        self.publisher.flush()

    def _count(self, placed: list[Placed], dead: list[DeadLetter]) -> None:
        self.stats.batches += 1
        self.stats.rows += len(placed)
        self.stats.dead_letters += len(dead)
        for p in placed:
            name = type(p.event).__name__
            self.stats.by_type[name] = self.stats.by_type.get(name, 0) + 1

    def run(self, idle_exit_s: float | None = None, on_batch=None) -> SinkStats:
        """Loop until `stop_requested` is set (the CLI sets it on SIGTERM/SIGINT, after the
        batch in hand is written with its offsets), or idle for `idle_exit_s`."""
        last_data = time.monotonic()
        kafka_errors = 0
        while not self.stop_requested.is_set():
            try:
                if self.conn is None:
                    self._connect()
                self.broker_watch.check()
                seen = self.poll_once()
                self.retire_windows()
                self.outage.recovered()
                kafka_errors = 0
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:  # the ledger went away
                self._disconnect()
                self.outage.wait(exc)
                continue
            except KafkaError as exc:
                kafka_errors += 1
                log.warning("kafka error, retrying: %s", exc)
                time.sleep(backoff_delay(kafka_errors, 0.5, 5.0))
                continue
            # The idle clock starts once there is something to read.
            if seen or not self.positions:
                last_data = time.monotonic()
            if seen:
                if on_batch:
                    on_batch(self.stats)
            elif idle_exit_s is not None and time.monotonic() - last_data > idle_exit_s:
                break
        if self.stop_requested.is_set():
            self.drain()
        return self.stats

    def retire_windows(self) -> None:
        """Delete the windows no reader needs whose records the ledger holds, after letting
        go of their partitions (a sink of one shard only: shards would each hold some)."""
        now = time.monotonic()
        if self.shard[1] != 1 or now - self.windows.last_pass < RETIRE_EVERY_S:
            return
        self.windows.last_pass = now
        for run_id, window in self.windows.due(self.connection, now):
            partitions = [
                tp
                for tp in self.positions
                if topic_window(tp.topic) == window and (parse_topic(tp.topic) or ("", ""))[0] == run_id
            ]
            if not partitions or not ledger_holds(self.settings, partitions):
                break
            for tp in partitions:
                del self.positions[tp]
            self.consumer.assign(sorted(self.positions, key=lambda tp: (tp.topic, tp.partition)))
            try:
                delete_topics(self.settings, sorted({tp.topic for tp in partitions}))
            except RuntimeError as exc:  # a client asked for them again: the broker re-created them, empty
                log.warning("window %d of run %s: %s; the run's end removes them", window, run_id, exc)
            else:
                log.info("retired window %d of run %s (%d partitions)", window, run_id, len(partitions))
            # its records are in the ledger either way: the sink moves on to the next window
            self.windows.forget(run_id, window)

    def drain(self, within_s: float = DRAIN_S) -> None:
        """Stopping: write what the topics hold now (what the run's other processes
        published while they stopped), for at most `within_s`; the services may be gone."""
        deadline = time.monotonic() + within_s
        try:
            # topics created since the last look too (a resumed run's, re-created as it stopped)
            self.refresh_assignment(every_s=0.0)
            while time.monotonic() < deadline and self.conn is not None and self.poll_once(timeout_ms=300):
                pass
        except (psycopg.Error, KafkaError) as exc:
            log.warning("stopping: the last records stay unwritten (%s)", exc)

    def close(self) -> None:
        self.consumer.close(autocommit=False)
        self.publisher.close()
        self._disconnect()
