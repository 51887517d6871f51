"""The ledger sink against the real embedded broker and PostgreSQL."""

from __future__ import annotations

import random
import signal
import threading
import time

import numpy as np
import pytest
from kafka import TopicPartition

from streamrl.consumers.ledger_sink import SINK_GROUP
from streamrl.producers.synthetic import SYNTHETIC, synthetic_events
from streamrl.runtime.blobs import PostgresBlobStore
from streamrl.runtime.bus import EventPublisher, MessageTooLarge, make_consumer
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema import codec, signing
from streamrl.schema.events import Trajectory, pack_float32, pack_int32, pack_mask
from streamrl.schema.topics import run_topics, topic_name
from tests.conftest import SinkThread, count_rows, start_sink_process, wait_for

TABLES = {
    "Task": "tasks",
    "Trajectory": "trajectories",
    "Evaluation": "evaluations",
    "Sample": "samples",
    "TrainStep": "train_steps",
    "WeightVersion": "weight_versions",
    "RunEvent": "run_events",
    "DeadLetter": "dead_letters",
}


# The embedded broker's ListOffsets(latest) answers the last batch's base offset rather
# than the log end, so "caught up" is judged against the offsets the producer was given.


def publish(settings, events) -> list:
    """Publish and return the (topic, partition, offset) of every message."""
    with EventPublisher(settings) as publisher:
        futures = [publisher.publish(event) for event in events]
    return [(m.topic, m.partition, m.offset) for m in (f.get(30) for f in futures)]


def log_ends(coordinates) -> dict[tuple[str, int], int]:
    ends: dict[tuple[str, int], int] = {}
    for topic, partition, offset in coordinates:
        ends[(topic, partition)] = max(ends.get((topic, partition), 0), offset + 1)
    return ends


def sink_reached(conn, ends: dict[tuple[str, int], int]) -> bool:
    stored = {
        (t, p): o
        for t, p, o in conn.execute(
            "select topic, partition, next_offset from consumer_offsets where consumer = %s", (SINK_GROUP,)
        ).fetchall()
    }
    return all(stored.get(tp, 0) >= end for tp, end in ends.items())


def test_10k_events_of_each_type_and_republishing_changes_nothing(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    produced = publish(stack, synthetic_events(run_id, 10_000))
    assert len(produced) == 80_000
    with SinkThread(stack, run_id):
        wait_for(lambda: sink_reached(ledger, log_ends(produced)), 180, what="sink to consume 80,000 events")
        counts = {name: count_rows(ledger, table, run_id) for name, table in TABLES.items()}
        assert counts == {name: 10_000 for name in TABLES}

        again = publish(stack, synthetic_events(run_id, 10_000))  # the same events again
        wait_for(lambda: sink_reached(ledger, log_ends(again)), 180, what="sink to consume the repeats")
        counts = {name: count_rows(ledger, table, run_id) for name, table in TABLES.items()}
        assert counts == {name: 10_000 for name in TABLES}
    # The ledger can read its own packed arrays back.
    tokens, num_tokens = ledger.execute(
        "select streamrl_int32s(tokens), num_tokens from trajectories where run_id = %s and trajectory_id = 'traj5'", (run_id,)
    ).fetchone()
    assert tokens == list(np.frombuffer(SYNTHETIC["Trajectory"](run_id, 5).tokens, dtype="<i4"))
    assert num_tokens == 64
    status = ledger.execute("select status from runs where run_id = %s", (run_id,)).fetchone()[0]
    assert status == "running"  # the last lifecycle event of the synthetic stream is "resumed"


def test_sink_killed_three_times_loses_and_duplicates_nothing(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    rng = random.Random(7)
    total_indices = 6_250  # x 8 types = 50,000 events
    done_publishing = threading.Event()
    produced = []

    def publish_slowly():
        with EventPublisher(stack) as publisher:
            futures = []
            for i, event in enumerate(synthetic_events(run_id, total_indices)):
                futures.append(publisher.publish(event))
                if i % 2_000 == 1_999:
                    publisher.flush()
                    time.sleep(0.15)  # keep events flowing while the sink is killed
        produced.extend((m.topic, m.partition, m.offset) for m in (f.get(30) for f in futures))
        done_publishing.set()

    producer = threading.Thread(target=publish_slowly)
    producer.start()
    kills = 0
    while kills < 3:
        sink = start_sink_process(run_id)
        # Kill it at a random moment after it has started writing.
        before = count_rows(ledger, "tasks", run_id)
        wait_for(lambda before=before: count_rows(ledger, "tasks", run_id) > before, 60, what="sink to write")
        time.sleep(rng.uniform(0.05, 1.0))
        sink.send_signal(signal.SIGKILL)
        sink.wait(10)
        kills += 1
    producer.join(120)
    assert done_publishing.is_set() and len(produced) == 50_000

    sink = start_sink_process(run_id, ready=True)  # the ledger may be caught up before it even started
    try:
        wait_for(lambda: sink_reached(ledger, log_ends(produced)), 180, what="restarted sink to catch up")
    finally:
        sink.send_signal(signal.SIGTERM)
        assert sink.wait(30) == 0

    for _name, table in TABLES.items():
        assert count_rows(ledger, table, run_id) == total_indices, table
    # The ledger holds exactly the messages produced: the same Kafka coordinates, each once.
    in_ledger = []
    for table in TABLES.values():
        in_ledger += ledger.execute(
            f"select kafka_topic, kafka_partition, kafka_offset from {table} where run_id = %s", (run_id,)
        ).fetchall()
    assert len(in_ledger) == len(set(in_ledger)) == 50_000
    assert sorted(in_ledger) == sorted(produced)


def run_key(settings, run_id: str) -> bytes:
    return signing.run_key(settings.bus_key, run_id)


def signed(settings, frame: bytes) -> bytes:
    """`frame` signed as the run's own processes sign theirs (the tests share its bus key)."""
    run_id = codec.decode(frame).run_id
    return signing.sign(run_key(settings, run_id), frame)


def test_garbage_on_every_topic_becomes_a_dead_letter_and_the_sink_goes_on(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    garbage_at = {}
    with EventPublisher(stack) as publisher:
        for kind, topic in run_topics(run_id).items():
            meta = publisher.producer.send(topic, key=b"g0", value=b"\x00not an event " + kind.encode()).get(10)
            garbage_at[topic] = (meta.partition, meta.offset)
        # A well-formed event on the wrong topic is refused too.
        meta = publisher.producer.send(
            topic_name(run_id, "tasks"), key=b"g0", value=signed(stack, codec.encode(SYNTHETIC["Evaluation"](run_id, 0)))
        ).get(10)
        wrong_topic_at = (meta.partition, meta.offset)
        # Valid events after the garbage, on the same partitions (same key).
        for index in range(8):
            publisher.publish(SYNTHETIC["Task"](run_id, index))
    with SinkThread(stack, run_id):
        wait_for(lambda: count_rows(ledger, "tasks", run_id) == 8, 60, what="tasks after the garbage")
        wait_for(lambda: count_rows(ledger, "dead_letters", run_id) == 9, 60, what="the dead letters")
    rows = ledger.execute(
        "select source_topic, source_partition, source_offset, error, raw from dead_letters "
        "where run_id = %s and stage = 'ledger-sink' order by source_topic",
        (run_id,),
    ).fetchall()
    by_topic = {}
    for topic, partition, offset, error, raw in rows:
        by_topic.setdefault(topic, []).append((partition, offset, error, bytes(raw)))
    for topic, (partition, offset) in garbage_at.items():
        matching = [r for r in by_topic[topic] if (r[0], r[1]) == (partition, offset)]
        assert len(matching) == 1, topic
        assert "unsigned frame (0x00)" in matching[0][2]  # refused before it is decoded
        assert matching[0][3].startswith(b"\x00not an event")
    wrong = [r for r in by_topic[topic_name(run_id, "tasks")] if (r[0], r[1]) == wrong_topic_at]
    assert "Evaluation event on a tasks topic" in wrong[0][2]
    assert len(rows) == 9
    # The dead letters are also events on the run's dead-letter topic.
    consumer = make_consumer(stack, None)
    dlq = [
        TopicPartition(topic_name(run_id, "dead_letters"), p)
        for p in consumer.partitions_for_topic(topic_name(run_id, "dead_letters"))
    ]
    consumer.assign(dlq)
    consumer.seek_to_beginning(*dlq)
    seen = []
    deadline = time.monotonic() + 10
    while len(seen) < 8 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            signed_values = [r.value for r in records if r.value.startswith(bytes([codec.FRAME_SIGNED]))]  # not the garbage
            seen += [codec.decode(signing.verified(run_key(stack, run_id), v, run_id)) for v in signed_values]
    consumer.close()
    assert {(d.source_topic, d.source_partition, d.source_offset) for d in seen} >= {
        (t, p, o) for t, (p, o) in garbage_at.items() if not t.endswith(".dead_letters")
    } | {(topic_name(run_id, "tasks"), *wrong_topic_at)}


def test_a_bundle_is_one_row_per_event_and_a_bad_frame_in_it_one_dead_letter(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    tasks = [SYNTHETIC["Task"](run_id, index) for index in range(6)]
    with EventPublisher(stack, bundle=True) as publisher:  # held per key, sent at the flush
        for task in tasks[:4]:
            publisher.publish(task)
    frames = [signed(stack, codec.encode(t)) for t in tasks[4:]]
    (mixed,) = codec.bundle([frames[0], b"\x00not an event", frames[1]], 1 << 20)
    with EventPublisher(stack) as publisher:
        meta = publisher.producer.send(topic_name(run_id, "tasks"), key=b"g0", value=mixed).get(10)
    with SinkThread(stack, run_id):
        wait_for(lambda: count_rows(ledger, "tasks", run_id) == 6, 60, what="the six tasks")
        wait_for(lambda: count_rows(ledger, "dead_letters", run_id) == 1, 60, what="the dead letter")
    ids = ledger.execute("select task_id from tasks where run_id = %s order by task_id", (run_id,)).fetchall()
    assert [i for (i,) in ids] == sorted(t.task_id for t in tasks)
    offsets = ledger.execute(
        "select kafka_offset from tasks where run_id = %s and task_id = any(%s)", (run_id, [t.task_id for t in tasks[4:]])
    ).fetchall()
    assert {o for (o,) in offsets} == {meta.offset}  # a bundle's events share its record's offset
    ((error, raw, offset),) = ledger.execute(
        "select error, raw, source_offset from dead_letters where run_id = %s", (run_id,)
    ).fetchall()
    assert "bundle frame 1" in error and "unsigned frame (0x00)" in error
    assert bytes(raw) == mixed and offset == meta.offset  # the whole record is kept


def test_a_row_the_database_rejects_is_dead_lettered_not_blocking(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    bad = SYNTHETIC["Task"](run_id, 0)
    bad.step = 2**40  # past PostgreSQL's integer
    publish(stack, [bad] + [SYNTHETIC["Task"](run_id, i) for i in range(1, 6)])
    with SinkThread(stack, run_id):
        wait_for(lambda: count_rows(ledger, "tasks", run_id) == 5, 60, what="the good tasks")
        wait_for(lambda: count_rows(ledger, "dead_letters", run_id) == 1, 30, what="the dead letter")
    error = ledger.execute("select error from dead_letters where run_id = %s", (run_id,)).fetchone()[0]
    assert "ledger rejected Task" in error


def test_a_nul_a_model_sampled_is_stored_as_a_replacement_character_not_dead_lettered(stack, ledger, run_id):
    """A byte-level tokenizer can sample 0x00, which PostgreSQL's text and jsonb refuse."""
    create_run_topics(stack, run_id)
    task = SYNTHETIC["Task"](run_id, 0)
    task.prompt = [{"role": "user", "content": "a\x00b"}]
    trajectory = Trajectory(
        run_id=run_id,
        trajectory_id="t-nul",
        task_id="t-nul",
        group_id="g",
        tokens=pack_int32([97, 0]),
        loss_mask=pack_mask([0, 1]),
        logprobs=pack_float32([0, -0.5]),
        response_text="x\x00y",
        extra_fields={"trace": [{"response": "\x00"}], "k\x00": 1},
    )
    publish(stack, [task, trajectory])
    with SinkThread(stack, run_id):
        wait_for(
            lambda: count_rows(ledger, "trajectories", run_id) == 1 and count_rows(ledger, "tasks", run_id) == 1,
            60,
            what="the rows with a NUL",
        )
    assert count_rows(ledger, "dead_letters", run_id) == 0
    text, extra, tokens = ledger.execute(
        "select response_text, extra_fields, streamrl_int32s(tokens) from trajectories where run_id = %s", (run_id,)
    ).fetchone()
    assert text == "x\ufffdy" and extra == {"trace": [{"response": "\ufffd"}], "k\ufffd": 1} and tokens == [97, 0]
    prompt = ledger.execute("select prompt from tasks where run_id = %s", (run_id,)).fetchone()[0]
    assert prompt == [{"role": "user", "content": "a\ufffdb"}]


def random_trajectory(run_id, n, seed=0, compressible=False):
    rng = np.random.default_rng(seed)
    tokens = np.zeros(n, dtype=np.int32) if compressible else rng.integers(0, 2**31 - 1, n)
    return Trajectory(
        run_id=run_id,
        trajectory_id=f"big{n}-{seed}-{'zeros' if compressible else 'random'}",
        task_id="t",
        group_id="g",
        tokens=pack_int32(tokens),
        loss_mask=pack_mask(np.ones(n)),
        logprobs=pack_float32(np.zeros(n) if compressible else -rng.random(n)),
    )


def test_events_over_the_broker_limit_are_compressed_or_sent_by_reference(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    huge = random_trajectory(run_id, 400_000)  # ~3.6 MB of incompressible arrays
    compressible = random_trajectory(run_id, 400_000, compressible=True)
    assert len(codec.encode(huge)) > stack.max_message_bytes
    with pytest.raises(MessageTooLarge, match="over the broker limit"):
        EventPublisher(stack).publish(huge)  # without a blob store: a clear error, not a loss
    blobs = PostgresBlobStore.open(stack.database_url)
    with EventPublisher(stack, blobs=blobs) as publisher:
        publisher.publish(huge)
        publisher.publish(compressible)
    blobs.close()
    with SinkThread(stack, run_id):
        wait_for(lambda: count_rows(ledger, "trajectories", run_id) == 2, 60, what="both large trajectories")
    for event in (huge, compressible):
        tokens, num = ledger.execute(
            "select tokens, num_tokens from trajectories where event_id = %s", (event.event_id,)
        ).fetchone()
        assert bytes(tokens) == event.tokens and num == 400_000
    assert ledger.execute("select count(*) from blobs where size > %s", (stack.max_message_bytes,)).fetchone()[0] >= 1


def test_a_rollout_spanning_two_weight_versions_keeps_each_tokens_version(stack, ledger, run_id):
    """A partial rollout resumed under new weights (`partial_rollout: resume`): its oldest
    version is its weight_version (what the staleness bound counts), its newest and each
    token's version are kept beside it."""
    create_run_topics(stack, run_id)
    spanning = Trajectory(
        run_id=run_id,
        trajectory_id="t-span",
        task_id="t-span",
        group_id="g-span",
        weight_version=4,
        tokens=pack_int32([1, 2, 7, 8, 9]),
        loss_mask=pack_mask([0, 0, 1, 1, 1]),
        logprobs=pack_float32([0, 0, -0.1, -0.2, -0.3]),
        token_versions=pack_int32([0, 0, 4, 5, 5]),
    )
    publish(stack, [spanning])
    with SinkThread(stack, run_id):
        wait_for(lambda: count_rows(ledger, "trajectories", run_id) == 1, 60, what="the spanning trajectory")
    row = ledger.execute(
        "select weight_version, newest_weight_version, streamrl_int32s(token_versions) from trajectories where run_id = %s",
        (run_id,),
    ).fetchone()
    assert row == (4, 5, [0, 0, 4, 5, 5])


def test_sigterm_commits_and_exits_zero(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    produced = publish(stack, synthetic_events(run_id, 500, types=["Task"]))
    sink = start_sink_process(run_id, ready=True)
    wait_for(lambda: count_rows(ledger, "tasks", run_id) == 500, 60, what="tasks")
    sink.send_signal(signal.SIGTERM)
    out, err = sink.communicate(timeout=30)
    assert sink.returncode == 0, err
    assert "sink stopped: 500 rows" in out
    assert sink_reached(ledger, log_ends(produced))  # offsets committed before exiting


def test_a_stopping_sink_writes_the_topics_created_since_it_last_looked(stack, ledger, run_id):
    """A resumed run re-creates its topics and may stop within the sink's first seconds
    (a finished run): the sink, told to stop, still writes what they hold."""
    with SinkThread(stack, run_id) as sink:
        sink.refresh_every_s = 3600.0  # it looks once, before the topics exist, and not again while running
        wait_for(lambda: sink._last_refresh > 0, 60, what="the sink's first look at the topics")
        create_run_topics(stack, run_id)
        publish(stack, synthetic_events(run_id, 50, types=["Task"]))
    assert count_rows(ledger, "tasks", run_id) == 50


def test_two_sharded_sinks_split_the_partitions_and_write_everything_once(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    produced = publish(stack, synthetic_events(run_id, 400, types=["Task", "Trajectory"]))
    with SinkThread(stack, run_id, shard=(0, 2)) as first, SinkThread(stack, run_id, shard=(1, 2)) as second:
        wait_for(
            lambda: count_rows(ledger, "tasks", run_id) == 400 and count_rows(ledger, "trajectories", run_id) == 400,
            60,
            what="both shards",
        )
        assert first.positions and second.positions
        assert not first.positions.keys() & second.positions.keys()
    assert sink_reached(ledger, log_ends(produced))


def test_sink_rejects_a_malformed_shard():
    from tests.conftest import run_cli

    result = run_cli("sink", "--shard", "2/2")
    assert result.returncode == 2 and "expected I/N" in result.stderr


def test_a_second_copy_of_a_stated_fact_with_other_content_is_a_dead_letter(stack, ledger, run_id):
    """A run event or a weight version is stated once: the same event again (a restart's
    re-announcement) changes nothing, the same id with other content is refused and
    kept as a dead letter, never silently dropped (the first copy stays)."""
    from streamrl.schema.events import RunEvent, WeightVersion

    create_run_topics(stack, run_id)
    created = RunEvent(run_id=run_id, kind="created", name="the run", config={"synthetic": True})
    version = WeightVersion(run_id=run_id, version=0, uri="/w/v000000", sha256="a" * 64)
    again = RunEvent(run_id=run_id, kind="created", name="the run", config={"synthetic": True})
    renamed = RunEvent(run_id=run_id, kind="created", name="renamed", config={"synthetic": True})
    moved = WeightVersion(run_id=run_id, version=0, uri="/elsewhere", sha256="b" * 64)
    assert created.event_id == again.event_id == renamed.event_id and version.event_id == moved.event_id
    publish(stack, [created, version])
    with SinkThread(stack, run_id):
        wait_for(lambda: count_rows(ledger, "weight_versions", run_id) == 1, 60, what="the first copies")
        publish(stack, [again, renamed, moved])
        wait_for(lambda: count_rows(ledger, "dead_letters", run_id) == 2, 60, what="the two conflicting copies")
    assert ledger.execute("select name from runs where run_id = %s", (run_id,)).fetchone() == ("the run",)
    assert ledger.execute("select uri from weight_versions where run_id = %s", (run_id,)).fetchall() == [("/w/v000000",)]
    letters = ledger.execute("select error, raw from dead_letters where run_id = %s order by source_topic", (run_id,)).fetchall()
    assert all("repeats an event id the ledger holds, with other content" in error for error, _ in letters)
    assert [codec.decode(raw) for _, raw in letters] == [renamed, moved]
