"""The stream processor as a faust app: trajectories + evaluations in, samples out.

The same job as `consumers/processor.py` (whose pure `group_outcome` it calls), shaped
for a cluster: the processors of a run form one consumer group, so any number of them
share the partitions of the two co-partitioned input topics (both are keyed by group
id, so a GRPO group's events share a partition number), and open groups live in a faust
Table whose changelog topic is the state's durable copy. A processor that is restarted,
or that takes over a partition in a rebalance, recovers the partition's open groups
from the changelog and goes on from the committed offsets.

Guarantees, at least once end to end and exactly once in the ledger: faust flushes what
was produced (table changes and samples) before it commits the input offsets, so a
crash re-reads events whose effects may already be out; re-added events are ignored
(the first copy of a trajectory wins), and a group emitted again carries the same
event ids, which the ledger keeps once.

A finished group stays in the table as a small marker (its trajectory ids), so that a
trajectory arriving after its group timed out is recorded as `late` and an event read
twice is not mistaken for a new group.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time

import msgspec
from kafka.partitioner.default import murmur2

from consumers.processor import group_outcome, load_custom_advantages
from algos.advantages import get_advantage_estimator
from runtime.bus import RunReader, frame, unframe, dead_letter
from runtime.blobs import PostgresBlobStore
from runtime.config import Recipe
from runtime.settings import Settings
from schema import codec
from schema.events import Evaluation, Event, GroupFiltered, Trajectory
from schema.topics import event_key, topic_name

log = logging.getLogger("streamrl.processor")
PROCESSOR_GROUP = "streamrl-processor"


class GroupState(msgspec.Struct):
    """One GRPO group in the table: the framed events read so far, or (closed) the ids
    of the trajectories it accounted for."""
    step: int = 0
    group_size: int = 0
    first_seen: float = 0.0  # wall clock: the timeout must survive a move to another process
    trajectories: dict[str, bytes] = {}
    evaluations: dict[str, bytes] = {}
    closed: bool = False
    accounted: list[str] = []


_encode_state = msgspec.msgpack.Encoder().encode
_decode_state = msgspec.msgpack.Decoder(GroupState).decode


def faust_broker_options(settings: Settings) -> dict:
    """The broker address and credentials of `settings`, as faust takes them."""
    import faust

    options: dict = {"broker": ";".join(f"kafka://{host}" for host in settings.kafka_bootstrap.split(","))}
    protocol = settings.security_protocol
    context = ssl.create_default_context(cafile=settings.ssl_cafile) if protocol.endswith("SSL") else None
    if protocol.startswith("SASL"):
        options["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username, password=settings.sasl_password,
            mechanism=settings.sasl_mechanism or "PLAIN", ssl_context=context)
    elif protocol == "SSL":
        options["broker_credentials"] = faust.SSLCredentials(context)
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

        algorithm, pool = recipe.algorithm, recipe.trajectory_pool
        load_custom_advantages(algorithm.custom_advantage_module_path)
        get_advantage_estimator(algorithm.type)  # fail now, with the known names, not on the first group
        self.settings, self.run_id, self.recipe = settings, run_id, recipe
        self.timeout_s = pool.group_timeout_s
        self.train_partial = pool.incomplete_group_policy == "train_partial"
        self.blobs: PostgresBlobStore | None = None
        static = settings.group_membership == "static"
        self.app = faust.App(
            f"{PROCESSOR_GROUP}.{run_id}", **faust_broker_options(settings), store="memory://", web_enabled=False,
            topic_partitions=settings.topic_partitions,
            consumer_auto_offset_reset="earliest", broker_session_timeout=settings.session_timeout_ms / 1000,
            # No standby replicas: a memory-store standby applies changelog records into the
            # same dict the active partitions use, and after a promotion an old record
            # overwrote newer state (seen: a group's evaluations lost). Recovery on
            # assignment reads the partition's changelog instead.
            table_standby_replicas=0,
            broker_heartbeat_interval=max(0.1, min(1.0, settings.session_timeout_ms / 3000)),
            consumer_group_instance_id=f"{PROCESSOR_GROUP}.{run_id}.{name}" if static else None,
            producer_acks=-1, producer_max_request_size=settings.max_message_bytes,
            key_serializer="raw", value_serializer="raw",  # framed events and msgpack state, as bytes
            # The embedded broker reports a partition's end offset as the base offset of its
            # last record batch + 1 (docs/decisions.md); faust's table recovery reads up to
            # that end and fails when it is short. One record per batch makes it exact.
            **({"producer_max_batch_size": 1} if settings.embedded_kafka else {}))
        raw = dict(key_serializer="raw", value_serializer="raw")
        self.inputs = [topic_name(run_id, kind) for kind in ("trajectories", "evaluations")]
        source = self.app.topic(*self.inputs, **raw)
        self.outputs = {kind: self.app.topic(topic_name(run_id, kind), **raw) for kind in ("samples", "dead_letters")}
        # keyed by group id with the producer's partitioner: the same partition as the
        # group's input events, so a partition's groups move with it
        self.groups = self.app.Table("groups", partitions=settings.topic_partitions, use_partitioner=True,
                                     key_type=bytes, value_type=bytes)  # bytes: stored raw
        self.app.agent(source, name="join")(self._join)
        self.app.timer(interval=1.0)(self._expire)
        self.lost: list[BaseException] = []
        self.generation: int | None = None  # the consumer generation `expected` belongs to
        self.expected: dict = {}  # input partition -> the next offset this process must read
        self.rewinding: set = set()  # input partitions sought back, waiting for their expected offset
        # before the first assignment starts faust's fetch loop, which binds the read offsets
        self.app.on_partitions_assigned.connect(self._unfilter_inputs)

    # --- the loop around the group maths ---------------------------------------------

    async def _join(self, stream):
        # Acked by hand: a record the offset guard sends back for re-reading must not be
        # acked (faust commits the acked offsets), or a crash before its re-read loses it.
        async for message in stream.noack().events():
            record = message.message
            if not await self._in_order(record):
                continue
            try:
                event = unframe(record.value, self._blob_store_if_needed(record.value))
            except (codec.CodecError, LookupError, ValueError) as exc:
                await self._send(dead_letter(record, self.run_id, str(exc), "processor"))
            else:
                if isinstance(event, (Trajectory, Evaluation)) and not event.is_val:
                    await self._add(event, record.value)
            message.ack()

    async def _unfilter_inputs(self, *args, **kwargs) -> None:
        consumer = self.app.consumer
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
        tp, offset = record.tp, record.offset
        # faust keeps the committed offsets it seeked to (None for 0 or none: accept what comes)
        expected = self.expected.get(tp, self.app.consumer._committed_offset.get(tp))
        if expected is None or offset <= expected:
            self.expected[tp] = max(offset + 1, expected or 0)
            self.rewinding.discard(tp)
            return True
        if tp not in self.rewinding:
            log.info("records %s-%s of %s[%d] came out of order: reading again from %s",
                     expected, offset - 1, tp.topic, tp.partition, expected)
            self.rewinding.add(tp)
            await self.app.consumer.seek(tp, expected)
        return False  # not acked: it comes again, in order

    async def _add(self, event: Trajectory | Evaluation, raw: bytes) -> None:
        key = event.group_id.encode()
        stored = self.groups.get(key)
        state = _decode_state(stored) if stored else GroupState(step=event.step, first_seen=time.time())
        if state.closed:
            if isinstance(event, Trajectory) and event.trajectory_id not in state.accounted:
                state.accounted.append(event.trajectory_id)  # it came after the group timed out
                self.groups[key] = _encode_state(state)
                await self._send_late(event.group_id, event.step, event.group_size, [event.trajectory_id])
            return  # else a second copy, or the evaluation of one accounted for
        if isinstance(event, Trajectory):
            state.group_size = event.group_size
            state.trajectories.setdefault(event.trajectory_id, raw)  # the first copy wins, as in the ledger
        else:
            state.evaluations.setdefault(event.trajectory_id, raw)
        joined = [tid for tid in state.trajectories if tid in state.evaluations]
        if state.group_size and len(joined) >= state.group_size:
            await self._emit(event.group_id, state)
        else:
            self.groups[key] = _encode_state(state)

    async def _expire(self) -> None:
        """Groups that never completed: emitted as timed out, by the process that owns them."""
        assigned = {(tp.topic, tp.partition) for tp in self.app.consumer.assignment()}
        now = time.time()
        for key, stored in list(self.groups.items()):
            state = _decode_state(stored)
            if state.closed or now - state.first_seen <= self.timeout_s:
                continue
            if (self.inputs[0], self._partition_of(key)) in assigned:
                await self._emit(key.decode(), state, timed_out=True)

    def _partition_of(self, key: bytes) -> int:
        """The partition a group's events and its table entry are on (the producers' murmur2)."""
        return (murmur2(key) & 0x7FFFFFFF) % self.settings.topic_partitions

    async def _emit(self, group_id: str, state: GroupState, timed_out: bool = False) -> None:
        decode = lambda raw: unframe(raw, self._blob_store_if_needed(raw))  # noqa: E731
        trajectories = {tid: decode(raw) for tid, raw in sorted(state.trajectories.items())}
        joined = [(t, decode(state.evaluations[tid])) for tid, t in trajectories.items() if tid in state.evaluations]
        algorithm = self.recipe.algorithm
        outcome = group_outcome(self.run_id, group_id, state.step, state.group_size, joined, algorithm.type,
                                algorithm.filter_zero_variance, timed_out, self.train_partial)
        self.groups[group_id.encode()] = _encode_state(GroupState(step=state.step, group_size=state.group_size,
                                                                  closed=True, accounted=sorted(trajectories)))
        unjoined = sorted(set(trajectories) - {t.trajectory_id for t, _ in joined})
        if unjoined:  # their evaluations had not arrived
            await self._send_late(group_id, state.step, state.group_size, unjoined)
        for event in [outcome] if isinstance(outcome, GroupFiltered) else outcome:
            await self._send(event)

    async def _send_late(self, group_id: str, step: int, group_size: int, trajectory_ids: list[str]) -> None:
        log.warning("group %s closed before trajectories %s were complete: recorded as late", group_id, trajectory_ids)
        await self._send(GroupFiltered(run_id=self.run_id, group_id=group_id, reason="late", step=step,
                                       group_size=group_size, received=len(trajectory_ids),
                                       trajectory_ids=trajectory_ids))

    async def _send(self, event: Event) -> None:
        await self.outputs[event.KIND].send(key=event_key(event), value=frame(event, self.settings.max_message_bytes,
                                                                              None))

    def _blob_store_if_needed(self, value: bytes | None):
        if value and codec.parse_reference(value) is not None and self.blobs is None:
            self.blobs = PostgresBlobStore.open(self.settings.database_url)
        return self.blobs

    # --- serving ------------------------------------------------------------------------

    def _watch_broker(self, worker, stop: threading.Event) -> None:
        """faust reconnects forever; StreamRL's rule is one sentence after
        STREAMRL_SERVICE_WAIT_S (runtime/outage.py). A plain reader of the run's small
        `runs` topic notices the lost broker and stops the worker."""
        try:
            reader = RunReader(self.settings, self.run_id, ["runs"], group_id=None, stage="processor")
        except Exception as exc:  # noqa: BLE001 - the broker went before the watch started
            self.lost.append(exc)
            worker.loop.call_soon_threadsafe(lambda: worker.loop.create_task(worker.stop()))
            return
        try:
            while not stop.is_set():
                reader.poll(timeout_ms=1000)
        except Exception as exc:  # noqa: BLE001 - ServiceLost, or the reader's own failure
            self.lost.append(exc)
            worker.loop.call_soon_threadsafe(lambda: worker.loop.create_task(worker.stop()))
        finally:
            reader.close()

    def run(self, tracebacks: bool = False) -> None:
        """Serve until SIGTERM/SIGINT; ServiceLost when the broker stays away. Without
        `tracebacks` (--debug), the Kafka clients' log lines come without theirs (a lost
        broker is one sentence, from the broker watch); with it, faust logs at info level
        too (assignments, table recovery)."""
        import faust

        class Worker(faust.Worker):
            def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
                super().on_setup_root_logger(logger, level)
                if not tracebacks:
                    for handler in logger.handlers:
                        handler.addFilter(drop_traceback)

        if not tracebacks:  # the consumer thread dies with the broker: a line, not a traceback
            threading.excepthook = lambda hook: log.warning("%s stopped: %s: %s", hook.thread.name,
                                                            hook.exc_type.__name__, hook.exc_value)
        worker = Worker(self.app, loglevel="info" if tracebacks else "warning", quiet=True, redirect_stdouts=False)
        stop = threading.Event()
        watch = threading.Thread(target=self._watch_broker, args=(worker, stop), name="broker-watch", daemon=True)
        watch.start()
        try:
            worker.execute_from_commandline()
        except SystemExit:  # how a faust worker ends, after SIGTERM/SIGINT too
            pass
        finally:
            stop.set()
            if self.blobs is not None:
                self.blobs.close()
        if self.lost:
            raise self.lost[0]
