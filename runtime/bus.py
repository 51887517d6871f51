"""The Kafka side of every process: topics, producers, consumers, and event frames.

Tuned for the embedded broker and for small latency-sensitive hops:
- the group session timeout is short (Tansu answers a JoinGroup after about half of
  it; kafka-python's 45 s default meant a 23 s wait for the first message);
- consumers refresh metadata every few seconds so pattern subscriptions see new runs;
- producers wait for all replicas (`acks=all`) and linger a few ms to batch; those that
  flush after each batch of work send a key's events as one bundle record
  (`EventPublisher(bundle=True)`), which every reader splits (`unframe_record`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Protocol

from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.errors import (
    CommitFailedError,
    FencedInstanceIdError,
    IllegalGenerationError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    UnknownProducerIdError,
)

from streamrl.runtime.blobs import PostgresBlobStore
from streamrl.runtime.dead_letters import check_placement, dead_letter
from streamrl.runtime.outage import BrokerWatch, topics_lost
from streamrl.runtime.settings import Settings, SettingsError
from streamrl.runtime.topic_admin import WindowTopics, track_topic
from streamrl.schema import codec, signing
from streamrl.schema.events import DeadLetter, Event
from streamrl.schema.topics import (
    ROTATED_KINDS,
    event_key,
    parse_topic,
    recent_windows,
    rotates,
    run_pattern,
    topic_for,
    topic_name,
    topic_window,
    windows_to_hold,
)
from streamrl.schema.topology import STAGE_FOLDERS, TopologyError, check_reads, check_writes

log = logging.getLogger("streamrl.bus")

# The fetch wait of readers whose latency does not matter (see make_consumer).
IDLE_FETCH_WAIT_MS = 500
# Room for the record batch and headers around one value.
FRAME_OVERHEAD_BYTES = 4096


class MessageTooLarge(ValueError):
    pass


class BlobWriter(Protocol):
    def put(self, sha256: str, data: bytes) -> None: ...


class BlobReader(Protocol):
    def get(self, sha256: str) -> bytes: ...


def make_producer(settings: Settings, **overrides) -> KafkaProducer:
    options = dict(
        acks="all",
        linger_ms=5,
        batch_size=512 * 1024,
        max_request_size=settings.max_message_bytes,
        retries=10,
        # Topics are created explicitly (`create_topics`). Auto-creation would let a process
        # that outlived a broker restart re-create a lost run's topics empty.
        allow_auto_create_topics=False,
    )
    options.update(overrides)
    return KafkaProducer(**settings.kafka_client_options(), **options)


def make_consumer(settings: Settings, group_id: str | None, **overrides) -> KafkaConsumer:
    session = settings.session_timeout_ms
    options = dict(
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session,
        heartbeat_interval_ms=max(100, min(1000, session // 3)),
        max_poll_interval_ms=300_000,
        metadata_max_age_ms=3000,
        # How long a fetch waits on the broker when there is nothing to read. Each empty
        # answer costs the embedded broker about half a millisecond of CPU; readers off
        # the training loop's critical path (the sink, watches) wait longer
        # (`IDLE_FETCH_WAIT_MS`). 500 for every reader cut a step's CPU by a third but
        # lengthened it by a fifth (bench/step_cpu.py).
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=max(1_048_576, settings.max_message_bytes + FRAME_OVERHEAD_BYTES),
        allow_auto_create_topics=False,
    )
    options.update(overrides)
    return KafkaConsumer(**settings.kafka_client_options(), **options)


def frame(event: Event, max_message_bytes: int, blobs: BlobWriter | None, bus_key: bytes | None = None) -> bytes:
    """The bytes to send for `event`: inline (compressed when large) or a blob reference;
    signed with its run's key when there is a bus key (schema/signing.py)."""
    data = codec.encode(event)
    room = max_message_bytes - FRAME_OVERHEAD_BYTES - (signing.SIGNED_OVERHEAD_BYTES if bus_key else 0)
    if len(data) > room:
        if blobs is None:
            raise MessageTooLarge(
                f"{type(event).__name__} {event.event_id} encodes to {len(data)} bytes, over the broker "
                f"limit of {max_message_bytes} (STREAMRL_KAFKA_MAX_MESSAGE_BYTES), and this producer has "
                "no blob store to send it by reference"
            )
        reference, ref = codec.encode_reference(data)
        blobs.put(ref.sha256, data)
        data = reference
    return signing.sign(signing.run_key(bus_key, event.run_id), data) if bus_key else data


def unframe_record(record, run_id: str, stage: str, blobs, bus_key: bytes | None = None) -> tuple[list[Event], list[DeadLetter]]:
    """The events of a consumer record (one, or a bundle's) and, if some frame cannot be
    decoded, one dead letter keeping the whole record with each bad frame's reason: the
    good events of a bundle go on without it. `blobs` is a BlobReader or a callable that
    opens one on first use. With a bus key, a frame not signed with the key of the run
    whose topic it is on is refused before it is decoded."""
    try:
        frames = codec.split_bundle(record.value)
    except codec.CodecError as exc:
        return [], [dead_letter(record, run_id, str(exc), stage)]
    events, errors = [], []
    placed = parse_topic(record.topic)
    for index, value in enumerate(frames):
        try:
            events.append(open_frame(value, placed, run_id, blobs, bus_key))
        except (codec.CodecError, LookupError, ValueError) as exc:  # kept as a dead letter; processing goes on
            errors.append(str(exc) if len(frames) == 1 else f"bundle frame {index}: {exc}")
    return events, [dead_letter(record, run_id, "; ".join(errors), stage)] if errors else []


def open_frame(value: bytes | None, placed: tuple[str, str] | None, run_id: str, blobs, bus_key: bytes | None) -> Event:
    """One frame of a record, in the order a reader must take it: with a bus key its
    signature under the key of the run whose topic it is on (`placed`: that topic's run
    and kind, None for another topic), then its payload (`blobs`: a BlobReader, or a
    callable that opens one for the verified frame), then its place. CodecError (or
    BlobMissing) says why it is refused."""
    topic_run = placed[0] if placed else run_id
    if bus_key is not None:
        value = signing.verified(signing.run_key(bus_key, topic_run), value, topic_run)
    event = unframe(value, blobs(value) if callable(blobs) else blobs)
    if placed is not None:
        check_placement(event, *placed)
    return event


def unframe(value: bytes | None, blobs: BlobReader | None) -> Event:
    """Decode a message value, fetching the payload first if it is a blob reference."""
    ref = codec.parse_reference(value) if value else None
    if ref is not None:
        if blobs is None:
            raise codec.CodecError(f"blob reference {ref.sha256} but no blob store to resolve it")
        value = blobs.get(ref.sha256)
    return codec.decode(value)


class EventPublisher:
    """Sends events to their run's topic, keyed so that a group shares a partition.

    With `bundle`, events are held until `flush` and sent as one record per topic and
    key (a bundle frame, split where it would pass the broker's limit): a worker's
    trajectories of one group, a group's samples. For producers that flush after each
    batch of work anyway (they commit their input offsets after the flush)."""

    def __init__(
        self,
        settings: Settings,
        blobs: BlobWriter | None = None,
        bundle: bool = False,
        stage: str = "",
        paced: bool = False,
        **producer_overrides,
    ):
        """`stage`: the stage publishing (schema/topology.py); each event is then checked
        against the topics that stage writes. Empty: not checked (tests, benchmarks).
        `paced`: a new topic window waits for room on the broker (topic_admin.py
        WindowTopics); where a run's events start: its tasks, or a replay's rollouts."""
        self._settings = settings
        self._stage = stage
        if stage and stage not in STAGE_FOLDERS:
            raise TopologyError(f"unknown stage {stage!r}; known: {', '.join(STAGE_FOLDERS)}")
        self._blobs = blobs
        self.producer = make_producer(settings, **producer_overrides)
        self._tracked: set[str] = set()  # the topics the producer's metadata follows (track_topic)
        self._in_flight: list = []  # futures since the last flush (workers publish from several threads)
        self._in_flight_lock = threading.Lock()
        self._bundle = bundle
        self._held: dict[tuple[str, bytes], list[bytes]] = {}  # (topic, key) -> frames, under the lock
        self._windows = WindowTopics(settings, paced)
        self._producer_overrides = producer_overrides

    def publish(self, event: Event):
        """Send `event` (with `bundle`: hold it until the next flush; returns None)."""
        if self._stage:
            check_writes(self._stage, event)
        topic, window = topic_for(event)
        if window is not None:
            with self._in_flight_lock:  # workers publish from several threads
                partitions = lambda: len(self.producer.partitions_for(topic_name(event.run_id, "tasks")) or ())  # noqa: E731
                if self._windows.open(event.run_id, window, partitions):
                    self._replace_producer()
        key = event_key(event)
        value = frame(event, self._settings.max_message_bytes, self._blobs, self._settings.bus_key)
        if self._bundle:
            with self._in_flight_lock:
                self._held.setdefault((topic, key), []).append(value)
            return None
        return self._send(topic, key, value)

    def _replace_producer(self) -> None:
        """A fresh producer, after the old one delivered what it holds (see WindowTopics)."""
        old = self.producer
        old.flush()
        self.producer, self._tracked = make_producer(self._settings, **self._producer_overrides), set()
        old.close()

    def _send(self, topic: str, key: bytes, value: bytes):
        with self._in_flight_lock:  # the producer may be being replaced
            if topic not in self._tracked:
                track_topic(self.producer, topic)
                self._tracked.add(topic)
            future = self.producer.send(topic, key=key, value=value)
            self._in_flight.append(future)
        return future

    def send_held(self, key: bytes | None = None) -> None:
        """Send the events held for `key` (every key's when None) without waiting; `flush`
        still waits for them."""
        with self._in_flight_lock:
            if key is None:
                held, self._held = self._held, {}
            else:
                held = {tk: self._held.pop(tk) for tk in [tk for tk in self._held if tk[1] == key]}
        for (topic, key), frames in held.items():
            for value in codec.bundle(frames, self._settings.max_message_bytes - FRAME_OVERHEAD_BYTES):
                self._send(topic, key, value)

    def flush(self, timeout: float | None = None, held: bool = True) -> None:
        """Wait for every event published since the last flush, and raise the first send
        that failed: callers commit their input offsets after a flush, so a send the
        broker never took (it was lost, say, and the client's retries ran out) must stop
        them rather than be skipped. `held=False` leaves the held events held (a worker
        whose other groups are still being rolled out)."""
        if held:
            self.send_held()
        self.producer.flush(timeout)
        with self._in_flight_lock:
            in_flight, self._in_flight = self._in_flight, []
        for future in in_flight:
            if future.failed():
                if isinstance(future.exception, UnknownProducerIdError):
                    # the broker forgot this producer: it restarted, and kept nothing
                    raise topics_lost(self._settings, None, "no longer knows this process's producer") from future.exception
                raise future.exception

    def close(self) -> None:
        self.send_held()
        self.producer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.flush()
        self.close()


class RunReader:
    """Reads some of one run's topics: the partitions of a shard, or those a consumer
    group gives this member.

    By shard (`shard` = (index, count)): the process takes the partitions it owns and
    starts at the offsets committed under `group_id` (or at `start_offsets`, or at the
    beginning). No group membership: nothing to rebalance, and nothing for a broker's
    group coordinator to get wrong (docs/decisions.md).

    As a group member (`member` names it): the reader subscribes under `group_id`, and the
    topics' partitions are shared among the members alive, following them as they join,
    leave or die; with `STREAMRL_GROUP_MEMBERSHIP=static` the member's name is its
    group.instance.id, so a restart under the same name gets its partitions back.

    Offsets are committed by the caller, after its effects are durable. `poll` returns
    decoded events with their coordinates; what cannot be decoded comes back as a
    DeadLetter for the caller to publish (nothing is dropped silently).
    """

    def __init__(
        self,
        settings: Settings,
        run_id: str,
        kinds: list[str],
        group_id: str | None,
        shard: tuple[int, int] = (0, 1),
        start_offsets: dict[TopicPartition, int] | None = None,
        from_beginning: bool = False,
        stage: str = "",
        wait_s: float = 30.0,
        member: str | None = None,
        keep_window=recent_windows,
        **consumer_overrides,
    ):
        """`keep_window(window, newest)`: which of a rotating run's windows to hold
        (schema/topics.py; the learner holds those with steps it has not trained)."""
        self.settings = settings
        self.run_id = run_id
        if stage:  # a component's reader: only the topics its stage reads (schema/topology.py)
            if stage not in STAGE_FOLDERS:
                raise TopologyError(f"unknown stage {stage!r}; known: {', '.join(STAGE_FOLDERS)}")
            check_reads(stage, kinds)
        self.stage = stage or (group_id or "reader")
        self.member = member
        if member is not None:
            if group_id is None:
                raise ValueError("a group member needs a group id")
            if settings.group_membership == "static":
                consumer_overrides["group_instance_id"] = f"{group_id}.{member}"
        self.consumer = make_consumer(settings, group_id, **consumer_overrides)
        topics = [topic_name(run_id, k) for k in kinds]
        self._shard = shard if member is None else (0, 1)
        self._partitions = self._wait_for_partitions(topics, self._shard, wait_s)
        self.broker_watch = BrokerWatch(settings, self.consumer, run_id, topics)
        self._blobs: PostgresBlobStore | None = None
        # A rotating run's window topics come and go (schema/topics.py): followed by name.
        rotated = [k for k in kinds if k in ROTATED_KINDS]
        self._windows = re.compile(run_pattern(run_id, rotated)) if rotated else None
        self._windows_checked, self._keep = 0.0, keep_window
        if member is not None:  # the group decides, and starts each partition at its committed offset
            if self._windows is not None and rotates(run_id):
                raise SettingsError(
                    f"run {run_id} rotates its topics (service.broker.window_steps), which group "
                    "members do not follow: use STREAMRL_PARTITION_ASSIGNMENT=shard"
                )
            self.consumer.subscribe(topics)
            return
        self._start_offsets, self._from_start = start_offsets, from_beginning or group_id is None
        self._assign([*self._partitions, *self._window_partitions()])

    def _start_at(self, tp: TopicPartition) -> int:
        if self._start_offsets is not None:
            return self._start_offsets.get(tp, 0)
        if self._from_start:
            return 0
        committed = self.consumer.committed(tp)
        return committed if committed is not None else 0

    def _window_partitions(self) -> list[TopicPartition]:
        """The shard's partitions of the run's window topics the broker has now."""
        if self._windows is None:
            return []
        self._windows_checked = time.monotonic()
        index, count = self._shard
        return [
            TopicPartition(topic, p)
            for topic in windows_to_hold(self.consumer.topics(), self._windows, self._keep)
            for p in self.consumer.partitions_for_topic(topic) or ()
            if p % count == index
        ]

    def _assign(self, partitions: list[TopicPartition]) -> None:
        """Hold `partitions`: new ones start at their start offset (a new window's at 0),
        those held already keep their position, gone ones (a retired window's) are let go."""
        held = set(self.consumer.assignment())
        self.consumer.assign(partitions)
        for tp in partitions:
            if tp not in held:
                self.consumer.seek(tp, self._start_at(tp))
        self._partitions = sorted(partitions)

    def follow_windows(self, every_s: float = 1.0) -> None:
        """Take up the windows opened and let go of those retired since the last look."""
        if self.member is not None or self._windows is None or time.monotonic() - self._windows_checked < every_s:
            return
        plain = [tp for tp in self._partitions if topic_window(tp.topic) is None]
        wanted = [*plain, *self._window_partitions()]
        if set(wanted) != set(self._partitions):
            self._assign(wanted)

    @property
    def partitions(self) -> list[TopicPartition]:
        """The partitions this reader holds now (a group member's change with the group)."""
        return sorted(self.consumer.assignment()) if self.member is not None else self._partitions

    def _wait_for_partitions(self, topics: list[str], shard: tuple[int, int], wait_s: float) -> list[TopicPartition]:
        index, count = shard
        deadline = time.monotonic() + wait_s
        while True:
            self.consumer.topics()  # refreshes metadata
            found = {t: self.consumer.partitions_for_topic(t) for t in topics}
            if all(found.values()):
                break
            if time.monotonic() > deadline:
                missing = [t for t, p in found.items() if not p]
                raise RuntimeError(
                    f"topics {missing} do not exist (was the run published? `streamrl topics {self.run_id}` creates them)"
                )
            time.sleep(0.2)
        ordered = sorted(TopicPartition(t, p) for t, parts in found.items() for p in parts)
        return [tp for tp in ordered if tp.partition % count == index]

    def positions(self) -> dict[TopicPartition, int]:
        return {tp: self.consumer.position(tp) for tp in self.partitions}

    def poll(self, timeout_ms: int = 100, max_records: int = 500) -> tuple[list[tuple[Event, TopicPartition, int]], list]:
        self.broker_watch.check()
        self.follow_windows()
        try:
            batch = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except FencedInstanceIdError:
            raise SettingsError(
                f"another member of {self.consumer.config['group_id']} took the name "
                f"{self.member!r} (STREAMRL_GROUP_MEMBERSHIP=static): give each one its own --name"
            ) from None
        events, dead = [], []
        for tp, records in batch.items():
            for record in records:
                decoded, bad = unframe_record(record, self.run_id, self.stage, self._blob_store_if_needed, self.settings.bus_key)
                events += [(event, tp, record.offset) for event in decoded]  # a bundle's events share its offset
                dead += bad
        return events, dead

    def first_needed_offsets(self, pending) -> dict[TopicPartition, int]:
        """Per partition, the offset a restart must read from: the earliest of `pending`
        (the (partition, offset) of events read but not yet done with: an open group, a
        step not yet trained), else the read position. Committing these never skips work."""
        offsets = self.positions()
        for tp, offset in pending:
            if tp in offsets:  # a group member may have lost the partition meanwhile
                offsets[tp] = min(offsets[tp], offset)
        return offsets

    def _blob_store_if_needed(self, value: bytes | None):
        if value and codec.parse_reference(value) is not None and self._blobs is None:
            self._blobs = PostgresBlobStore.open(self.settings.database_url)
        return self._blobs

    def commit(self, offsets: dict[TopicPartition, int]) -> bool:
        """Commit `offsets`; False when a group member's commit was refused because the
        group rebalanced meanwhile: the partitions' new owners re-read from the last
        commit, and the events they re-make keep their ids (the first copy wins)."""
        if self.member is not None:
            offsets = {tp: o for tp, o in offsets.items() if tp in self.consumer.assignment()}
        if not offsets:
            return True
        try:
            self.consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
        except (CommitFailedError, RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError) as exc:
            if self.member is None:
                raise
            log.warning(
                "%s: commit refused after a rebalance (%s); the new owners re-read those events", self.stage, type(exc).__name__
            )
            return False
        return True

    def close(self) -> None:
        self.consumer.close()
        if self._blobs is not None:
            self._blobs.close()
