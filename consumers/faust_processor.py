"""The stream processor as a faust app: trajectories + evaluations in, samples out.

The same job as `consumers/processor.py` (whose pure `group_outcome` it calls), shaped
for a cluster: the processors of a run form one consumer group, so any number of them
share the partitions of the two co-partitioned input topics (both are keyed by group
id, so a GRPO group's events share a partition number).

Guarantees, at least once end to end and exactly once in the ledger. Open groups live
in memory, and an input event is acked only when its group is closed (or when it is
one the processor has no use for), so faust commits each input partition only up to
the first event of a group still open: a restarted processor, or one that takes over a
partition in a rebalance, reads that group's events again and rebuilds it. faust
flushes what was produced (samples and table changes) before it commits, so a crash can
re-send a group's outcome, which carries the same event ids (the ledger keeps it once).

The Table holds one small marker per closed group (the trajectory ids it accounted for;
its changelog topic is the durable copy), written once when the group closes: a
trajectory arriving after its group timed out is recorded as `late`, and an event read
again after a restart is recognised as one of a closed group. Keeping open groups in the
table instead cost a changelog write of the whole group per event (bench/step_cpu.py:
the processor and the broker then took 0.8 s of CPU a 256-rollout step;
docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from streamrl.algos.advantages import get_advantage_estimator
from streamrl.consumers.faust_ending import WorkerEnding
from streamrl.consumers.faust_recovery import RecoveryStalled, RecoveryWatch
from streamrl.consumers.open_group import OpenGroup
from streamrl.consumers.processor import PROCESSOR_GROUP, group_outcome, load_custom_advantages
from streamrl.runtime.blobs import PostgresBlobStore
from streamrl.runtime.bus import FRAME_OVERHEAD_BYTES, frame, unframe_record
from streamrl.runtime.config import Recipe
from streamrl.runtime.settings import Settings
from streamrl.schema import codec
from streamrl.schema.events import Evaluation, Event, GroupFiltered, Trajectory
from streamrl.schema.topics import event_key, topic_name
from streamrl.schema.topology import check_reads, check_writes

log = logging.getLogger("streamrl.processor")


class ClosedGroup(msgspec.Struct):
    """A closed GRPO group's marker in the table: the trajectories it accounted for."""

    step: int = 0
    group_size: int = 0
    accounted: list[str] = []


_encode_marker = msgspec.msgpack.Encoder().encode
_decode_marker = msgspec.msgpack.Decoder(ClosedGroup).decode


class AckWhenReleased:
    """A consumed record, acked when everything holding it lets go: the record itself
    while its events are added, and each open group one of its events went into."""

    def __init__(self, message):
        self.message, self.holders = message, 1

    def hold(self) -> None:
        self.holders += 1

    def release(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            self.message.ack()


def refuse_topic_auto_creation() -> None:
    """aiokafka asks the broker to create every topic its metadata requests name (its
    MetadataRequest defaults `allow_auto_topic_creation` to true, and no setting changes
    it). After a restart of a broker that keeps records in memory, that re-made a run's
    topics empty under every reader, which then waited on them for ever instead of
    saying the broker lost them (docs/operations.md, the cluster's broker restart).
    StreamRL's Kafka clients never create a topic by asking for it: the default is false
    here too."""
    from aiokafka.protocol import metadata

    if getattr(metadata.MetadataRequest.__init__, "streamrl_no_auto_create", False):
        return
    create = metadata.MetadataRequest.__init__

    def without_auto_creation(self, topics=None, allow_auto_topic_creation=False):
        create(self, topics, allow_auto_topic_creation)

    without_auto_creation.streamrl_no_auto_create = True  # type: ignore[attr-defined]
    metadata.MetadataRequest.__init__ = without_auto_creation


def faust_broker_options(settings: Settings) -> dict:
    """The broker address and credentials of `settings`, as faust takes them."""
    import faust

    options: dict = {"broker": ";".join(f"kafka://{host}" for host in settings.kafka_bootstrap.split(","))}
    protocol = settings.security_protocol
    context = ssl.create_default_context(cafile=settings.ssl_cafile) if protocol.endswith("SSL") else None
    if protocol.startswith("SASL"):
        options["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            mechanism=settings.sasl_mechanism or "PLAIN",
            ssl_context=context,
        )
    elif protocol == "SSL":
        options["broker_credentials"] = faust.SSLCredentials(context)
    return options


def aiokafka_options(settings: Settings) -> dict:
    """The broker address and credentials of `settings`, as aiokafka takes them."""
    options = settings.kafka_client_options()
    cafile = options.pop("ssl_cafile", None)
    if options["security_protocol"].endswith("SSL"):
        options["ssl_context"] = ssl.create_default_context(cafile=cafile)
    return options


def drop_traceback(record: logging.LogRecord) -> bool:
    """A logging filter: keep the line, drop the traceback."""
    record.exc_info, record.exc_text, record.stack_info = None, None, None
    return True


class _ReadOffsetsOutsideInputs(dict):
    """faust's per-partition read offsets, which it uses to drop records below the last
    one read; for the input topics it answers None (no filter), so a record fetched again
    after a seek is never dropped. `FaustProcessor._in_order` orders the inputs instead."""

    def __init__(self, input_topics: list[str], read_offsets: dict):
        super().__init__(read_offsets)
        self.input_topics = frozenset(input_topics)

    def __getitem__(self, tp):
        return None if tp.topic in self.input_topics else self.get(tp)


class FaustProcessor:
    """Builds the run's faust app; `run()` serves it until SIGTERM/SIGINT (or a lost broker)."""

    def __init__(self, settings: Settings, run_id: str, recipe: Recipe, name: str):
        import faust

        refuse_topic_auto_creation()
        algorithm, pool = recipe.algorithm, recipe.trajectory_pool
        load_custom_advantages(algorithm.custom_advantage_module_path)
        get_advantage_estimator(algorithm.type)  # fail now, with the known names, not on the first group
        self.settings, self.run_id, self.recipe = settings, run_id, recipe
        self.timeout_s = pool.group_timeout_s
        self.train_partial = pool.incomplete_group_policy == "train_partial"
        self.blobs: PostgresBlobStore | None = None
        static = settings.group_membership == "static"
        # The embedded broker reports a partition's end offset as the base offset of its
        # last record batch + 1 (docs/decisions.md); faust's table recovery reads up to
        # that end and fails when it is short. One record per batch makes it exact.
        one_record_batches: dict[str, Any] = {"producer_max_batch_size": 1} if settings.embedded_kafka else {}
        self.app = faust.App(
            f"{PROCESSOR_GROUP}.{run_id}",
            **faust_broker_options(settings),
            store="memory://",
            web_enabled=False,
            # faust makes `<app id>-data/` in the working directory even for memory tables:
            # a folder of its own instead, made when the worker starts, removed when it ends
            datadir=Path(tempfile.gettempdir()) / f"streamrl-faust-{uuid.uuid4().hex}",
            topic_partitions=settings.topic_partitions,
            consumer_auto_offset_reset="earliest",
            broker_session_timeout=settings.session_timeout_ms / 1000,
            # No standby replicas: a memory-store standby applies changelog records into the
            # same dict the active partitions use, and after a promotion an old record
            # overwrote newer state (seen: a group's evaluations lost). Recovery on
            # assignment reads the partition's changelog instead.
            table_standby_replicas=0,
            # Events of open groups stay unacked until their group closes: a rebalance or a
            # stop must not wait for them (faust's default), only commit what is acked.
            stream_wait_empty=False,
            broker_heartbeat_interval=max(0.1, min(1.0, settings.session_timeout_ms / 3000)),
            consumer_group_instance_id=f"{PROCESSOR_GROUP}.{run_id}.{name}" if static else None,
            producer_acks=-1,
            producer_max_request_size=settings.max_message_bytes,
            key_serializer="raw",
            value_serializer="raw",  # framed events and msgpack state, as bytes
            **one_record_batches,
        )
        raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
        check_reads("processor", ("trajectories", "evaluations"))
        self.inputs = [topic_name(run_id, kind) for kind in ("trajectories", "evaluations")]
        source = self.app.topic(*self.inputs, **raw)
        # keyed by group id with the producer's partitioner: the same partition as the
        # group's input events, so a partition's groups move with it
        self.closed = self.app.Table(
            "closed_groups", partitions=settings.topic_partitions, use_partitioner=True, key_type=bytes, value_type=bytes
        )  # bytes: stored raw
        self.app.agent(source, name="join")(self._join)
        self.app.timer(interval=1.0)(self._expire)
        self.recovery_watch = RecoveryWatch(self.app)
        self.app.timer(interval=5.0)(self._watch_recovery)
        self.worker: faust.Worker | None = None  # set by run()
        self.open: dict[str, OpenGroup] = {}
        # tasks started without awaiting them: held until done (the event loop keeps only
        # weak references, so an unheld task can be collected before it acks its inputs)
        self.background: set[asyncio.Future] = set()
        # Samples and dead letters go out through a producer of their own that batches
        # (linger 5 ms): faust's producer sends one record per batch on the embedded
        # broker (above), so a group's samples took one produce request each and woke
        # every consumer of the samples topic once per sample (bench/step_cpu.py: 0.4 s of
        # broker CPU a 256-rollout step). A group's input events are acked once its
        # outputs are delivered, so a commit never passes an undelivered group.
        self.output_producer: Any = None  # an aiokafka producer, made on the first send
        self.ending = WorkerEnding(settings, run_id)  # the broker watch, and whether a stop was clean
        self.generation: int | None = None  # the consumer generation `expected` belongs to
        self.expected: dict = {}  # input partition -> the next offset this process must read
        self.rewinding: set = set()  # input partitions sought back, waiting for their expected offset
        # before the first assignment starts faust's fetch loop, which binds the read offsets
        self.app.on_partitions_assigned.connect(self._unfilter_inputs)
        self.app.on_before_shutdown.connect(self._stop_output_producer)

    # --- the loop around the group maths ---------------------------------------------

    async def _join(self, stream):
        # Acked by hand: an event is acked when its group closes (faust commits only acked
        # offsets), and a record the offset guard sends back for re-reading never is.
        async for message in stream.noack().events():
            record = message.message
            if not await self._in_order(record):
                continue
            events, dead = unframe_record(record, self.run_id, "processor", self._blob_store_if_needed, self.settings.bus_key)
            for letter in dead:
                await asyncio.gather(*await self._send([letter]))
            hold = AckWhenReleased(message)  # a bundle's events may wait on their group
            for event in events:
                if isinstance(event, (Trajectory, Evaluation)) and not event.is_val:
                    await self._add(event, hold, record.partition)
            hold.release()

    async def _unfilter_inputs(self, *args: Any, **kwargs: Any) -> None:
        consumer: Any = self.app.consumer  # faust's own read-offset filter is not in its types
        if not isinstance(consumer._read_offset, _ReadOffsetsOutsideInputs):
            consumer._read_offset = _ReadOffsetsOutsideInputs(self.inputs, consumer._read_offset)

    async def _in_order(self, record) -> bool:
        """Whether to process `record`: the next offset of its partition, or one read
        again. On a gap, seek the partition back to the first missing offset, and drop
        what comes before that offset arrives (records fetched before the seek).

        Why: around a rebalance, faust can hand the stream records fetched from a
        partition's old position before the ones from its committed offset (its recovery
        resumes the partitions before it seeks them; faust-streaming issues 216 and 221).
        Its read-offset filter then dropped the re-fetched records for good (seen here:
        two processors, one killed, a record or two lost in one run in four), so for the
        input topics that filter is off (`_ReadOffsetsOutsideInputs`) and this check
        puts the order back. Input offsets have no gaps (no transactions, no compaction),
        and every event is idempotent, so reading one again changes nothing."""
        generation = self.app.consumer_generation_id
        if generation != self.generation:  # a rebalance: each partition starts at its committed offset
            self.generation, self.expected, self.rewinding = generation, {}, set()
            self._drop_unowned_groups()
        tp, offset = record.tp, record.offset
        # faust keeps the committed offsets it seeked to (None for 0 or none: accept what comes)
        committed = self.app.consumer._committed_offset  # type: ignore[attr-defined]  # faust's seeked offsets, not in its types
        expected = self.expected.get(tp, committed.get(tp))
        if expected is None or offset <= expected:
            self.expected[tp] = max(offset + 1, expected or 0)
            self.rewinding.discard(tp)
            return True
        if tp not in self.rewinding:
            log.info(
                "records %s-%s of %s[%d] came out of order: reading again from %s",
                expected,
                offset - 1,
                tp.topic,
                tp.partition,
                expected,
            )
            self.rewinding.add(tp)
            await self.app.consumer.seek(tp, expected)
        return False  # not acked: it comes again, in order

    def _drop_unowned_groups(self) -> None:
        """Forget the open groups of partitions this process no longer owns: their events
        are unacked, so the new owner reads them from the committed offset."""
        owned = {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.inputs[0]}
        self.open = {gid: group for gid, group in self.open.items() if group.partition in owned}

    async def _add(self, event: Trajectory | Evaluation, hold: AckWhenReleased, partition: int) -> None:
        group_id = event.group_id
        marker = self.closed.get(group_id.encode())
        if marker is not None:
            closed = _decode_marker(marker)
            if isinstance(event, Trajectory) and event.trajectory_id not in closed.accounted:
                closed.accounted.append(event.trajectory_id)  # it came after the group timed out
                self.closed[group_id.encode()] = _encode_marker(closed)
                await asyncio.gather(*await self._send_late(group_id, event.step, event.group_size, [event.trajectory_id]))
            return  # else a second copy, or the evaluation of one accounted for
        group = self.open.get(group_id)
        if group is None:
            group = self.open[group_id] = OpenGroup(step=event.step, partition=partition)
        hold.hold()
        group.add(event, hold)
        if group.complete():
            await self._emit(group_id, group)

    async def _expire(self) -> None:
        """Groups that never completed: emitted as timed out, by the process that owns them."""
        assigned = {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.inputs[0]}
        now = time.monotonic()
        for group_id, group in list(self.open.items()):
            if now - group.first_seen > self.timeout_s and group.partition in assigned and group_id in self.open:
                await self._emit(group_id, group, timed_out=True)

    async def _watch_recovery(self) -> None:
        try:
            await self.recovery_watch.check()
        except RecoveryStalled as exc:  # one sentence, and a restart by the supervisor
            self.ending.lost.append(exc)
            if self.worker is not None:
                self.in_background(self.worker.stop())

    async def _emit(self, group_id: str, group: OpenGroup, timed_out: bool = False) -> None:
        # closed before the first await: the timer and the agent interleave at each one
        del self.open[group_id]
        trajectories = dict(sorted(group.trajectories.items()))
        joined = group.joined()
        algorithm = self.recipe.algorithm
        outcome = group_outcome(
            self.run_id,
            group_id,
            group.step,
            group.group_size,
            joined,
            algorithm.type,
            algorithm.filter_zero_variance,
            timed_out,
            self.train_partial,
            std_epsilon=algorithm.grpo_std_epsilon,
            credit_assignment=algorithm.credit_assignment,
        )
        self.closed[group_id.encode()] = _encode_marker(
            ClosedGroup(step=group.step, group_size=group.group_size, accounted=list(trajectories))
        )
        unjoined = sorted(set(trajectories) - {t.trajectory_id for t, _ in joined})
        sent = []
        if unjoined:  # their evaluations had not arrived
            sent += await self._send_late(group_id, group.step, group.group_size, unjoined)
        sent += await self._send([outcome] if isinstance(outcome, GroupFiltered) else outcome)
        self.in_background(self._release_when_delivered(sent, group.held))

    def in_background(self, awaitable) -> None:
        task = asyncio.ensure_future(awaitable)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _release_when_delivered(self, sent: list, holds: list[AckWhenReleased]) -> None:
        """Release a group's input records once its outputs are on the broker (faust
        commits acked offsets only). A send that fails leaves them unacked: read again."""
        try:
            await asyncio.gather(*sent)
        except Exception as exc:  # the producer's retries ran out
            log.warning("could not send a group's outcome (%s): its events will be read again", exc)
            return
        for hold in holds:
            hold.release()

    async def _send_late(self, group_id: str, step: int, group_size: int, trajectory_ids: list[str]):
        log.warning("group %s closed before trajectories %s were complete: recorded as late", group_id, trajectory_ids)
        return await self._send(
            [
                GroupFiltered(
                    run_id=self.run_id,
                    group_id=group_id,
                    reason="late",
                    step=step,
                    group_size=group_size,
                    received=len(trajectory_ids),
                    trajectory_ids=trajectory_ids,
                )
            ]
        )

    async def _send(self, events: Sequence[Event]) -> list[asyncio.Future[Any]]:
        """Queue `events` (of one topic and key: a group's outcome) on the output producer,
        bundled into as few records as fit; the futures resolve when they are delivered."""
        if self.output_producer is None:
            from aiokafka import AIOKafkaProducer

            self.output_producer = AIOKafkaProducer(
                **aiokafka_options(self.settings), acks="all", linger_ms=5, max_request_size=self.settings.max_message_bytes
            )
            await self.output_producer.start()
        if not events:
            return []
        limit = self.settings.max_message_bytes
        for event in events:
            check_writes("processor", event)
        topic, key = topic_name(self.run_id, events[0].KIND), event_key(events[0])
        frames = [frame(event, limit, None, self.settings.bus_key) for event in events]
        values = codec.bundle(frames, limit - FRAME_OVERHEAD_BYTES)
        return [await self.output_producer.send(topic, key=key, value=value) for value in values]

    async def _stop_output_producer(self, *args, **kwargs) -> None:
        if self.output_producer is not None:
            await self.output_producer.stop()  # delivers what is queued first

    def _blob_store_if_needed(self, value: bytes | None):
        if value and codec.parse_reference(value) is not None and self.blobs is None:
            self.blobs = PostgresBlobStore.open(self.settings.database_url)
        return self.blobs

    # --- serving ------------------------------------------------------------------------

    def run(self, tracebacks: bool = False) -> None:
        """Serve until SIGTERM/SIGINT; ServiceLost when the broker stays away,
        RecoveryStalled when table recovery is stuck (consumers/faust_recovery.py). Without
        `tracebacks` (--debug), the Kafka clients' log lines come without theirs (a lost
        broker is one sentence, from the broker watch); with it, faust logs at info level
        too (assignments, table recovery)."""
        import faust

        run_id = self.run_id

        class Worker(faust.Worker):
            def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
                super().on_setup_root_logger(logger, level)
                # The Kafka clients log a debug record per request, and a record is built
                # whenever a logger's level lets it through; at the worker's level they cost
                # nothing (seen in a profile: a tenth of the processor's CPU)
                for name in ("aiokafka", "kafka", "faust", "mode"):
                    logging.getLogger(name).setLevel(level)
                if not tracebacks:
                    for handler in logger.handlers:
                        handler.addFilter(drop_traceback)

            async def on_startup_finished(self) -> None:
                await super().on_startup_finished()
                # what a supervisor or a test waits for: started, tables recovered, reading
                print(f"processor running: run {run_id} (SIGTERM or Ctrl-C stops it)", flush=True)

        if not tracebacks:  # the consumer thread dies with the broker: a line, not a traceback
            threading.excepthook = lambda hook: log.warning(
                "%s stopped: %s: %s", getattr(hook.thread, "name", "a thread"), hook.exc_type.__name__, hook.exc_value
            )
        worker = self.worker = Worker(self.app, loglevel="info" if tracebacks else "warning", quiet=True, redirect_stdouts=False)
        self.ending.start_watch(worker)
        try:
            worker.execute_from_commandline()
        except SystemExit as end:  # how a faust worker ends, after SIGTERM/SIGINT too
            self.ending.raise_unless_asked_to_stop(worker, self.app, end.code)
        except Exception as crash:  # mode re-raises a crash: the lost broker may be its cause
            self.ending.raise_if_the_broker_was_lost(worker, crash)
            raise
        finally:
            self.ending.stop_watch()
            shutil.rmtree(self.app.conf.datadir, ignore_errors=True)
            if self.blobs is not None:
                self.blobs.close()
