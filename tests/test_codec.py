"""The event codec: round trips, deterministic ids, clear errors for garbage."""

import re

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from streamrl.schema import codec
from streamrl.schema.codec import CodecError
from streamrl.schema.events import (
    DeadLetter,
    Evaluation,
    RunEvent,
    Sample,
    Task,
    TrainStep,
    Trajectory,
    Turn,
    WeightVersion,
    make_event_id,
    pack_float32,
    pack_int32,
    pack_mask,
    unpack_float32,
    unpack_int32,
    unpack_mask,
)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
run_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,15}", fullmatch=True)
floats = st.floats(allow_nan=False, width=32)
token_lists = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=300)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | floats | names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def trajectories(draw):
    tokens = draw(token_lists)
    n = len(tokens)
    return Trajectory(
        run_id=draw(run_ids),
        trajectory_id=draw(names),
        task_id=draw(names),
        group_id=draw(names),
        sample_index=draw(st.integers(0, 64)),
        weight_version=draw(st.integers(0, 10**6)),
        tokens=pack_int32(tokens),
        loss_mask=pack_mask(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))),
        logprobs=pack_float32(draw(st.lists(floats, min_size=n, max_size=n))),
        prompt_text=draw(names),
        response_text=draw(names),
        turns=[Turn(role="assistant", start=0, end=n, trained=True)] if n else [],
        timings=draw(st.dictionaries(names, floats, max_size=3)),
        is_val=draw(st.booleans()),
        extra_fields=draw(st.dictionaries(names, json_values, max_size=3)),
        error=draw(st.none() | names),
    )


events = st.one_of(
    trajectories(),
    st.builds(
        Task,
        run_id=run_ids,
        task_id=names,
        group_id=names,
        sample_index=st.integers(0, 64),
        group_size=st.integers(1, 64),
        prompt=names | st.lists(st.dictionaries(names, names, max_size=2), max_size=3),
        data=st.dictionaries(names, json_values, max_size=4),
        is_val=st.booleans(),
        step=st.integers(0, 10**6),
        min_weight_version=st.integers(0, 10**6),
    ),
    st.builds(
        Evaluation,
        run_id=run_ids,
        trajectory_id=names,
        group_id=names,
        reward=floats,
        metrics=st.dictionaries(names, floats, max_size=4),
        ground_truth=json_values,
        evaluator=names,
        error=st.none() | names,
    ),
    st.builds(
        Sample,
        run_id=run_ids,
        trajectory_id=names,
        group_id=names,
        advantage=floats,
        reward=floats,
        tokens=token_lists.map(pack_int32),
        weight_version=st.integers(0, 10**6),
    ),
    st.builds(
        TrainStep,
        run_id=run_ids,
        step=st.integers(0, 10**6),
        loss=floats,
        kl=st.none() | floats,
        sample_ids=st.lists(names, max_size=5),
        consumed_offsets=st.dictionaries(names, st.integers(0, 2**62), max_size=3),
    ),
    st.builds(WeightVersion, run_id=run_ids, version=st.integers(0, 10**6), uri=names, sha256=names),
    st.builds(
        RunEvent,
        run_id=run_ids,
        kind=st.sampled_from(["created", "started", "finished", "failed"]),
        config=st.dictionaries(names, json_values, max_size=3),
        parent_run_id=st.none() | run_ids,
    ),
    st.builds(
        DeadLetter,
        run_id=run_ids,
        source_topic=names,
        source_partition=st.integers(0, 1000),
        source_offset=st.integers(0, 2**62),
        raw=st.binary(max_size=100),
        error=names,
    ),
)


@given(events)
@hsettings(max_examples=300, deadline=None)
def test_every_event_type_round_trips(event):
    decoded = codec.decode(codec.encode(event))
    assert type(decoded) is type(event)
    assert decoded == event


@given(trajectories())
@hsettings(max_examples=50, deadline=None)
def test_round_trip_through_compression(event):
    decoded = codec.decode(codec.encode(event, compress_over=0))
    assert decoded == event


def test_packed_arrays_are_binary_not_json_lists():
    tokens = np.arange(4096, dtype=np.int32)
    event = Trajectory(
        run_id="r",
        trajectory_id="x",
        task_id="t",
        group_id="g",
        tokens=pack_int32(tokens),
        loss_mask=pack_mask(np.ones(4096)),
        logprobs=pack_float32(np.full(4096, -0.25)),
    )
    frame = codec.encode(event, compress_over=10**9)
    # 4 bytes a token + 1 a mask byte + 4 a logprob, plus a small header: no per-number overhead.
    assert 9 * 4096 < len(frame) < 9 * 4096 + 400
    decoded = codec.decode(frame)
    np.testing.assert_array_equal(unpack_int32(decoded.tokens), tokens)
    np.testing.assert_array_equal(unpack_mask(decoded.loss_mask), np.ones(4096))
    np.testing.assert_array_equal(unpack_float32(decoded.logprobs), np.full(4096, -0.25, dtype=np.float32))


def test_event_ids_are_deterministic_and_distinct():
    a1 = Task(run_id="r1", task_id="t1", group_id="g")
    a2 = Task(run_id="r1", task_id="t1", group_id="g", prompt="different payload, same task")
    b = Task(run_id="r1", task_id="t2", group_id="g")
    other_run = Task(run_id="r2", task_id="t1", group_id="g")
    assert a1.event_id == a2.event_id == make_event_id("tasks", "r1", "t1")
    assert len({a1.event_id, b.event_id, other_run.event_id}) == 3
    step = TrainStep(run_id="r1", step=3)
    assert step.event_id == TrainStep(run_id="r1", step=3, loss=9.0).event_id


def test_event_ids_are_uuid5_of_the_natural_key():
    # the ids recorded by earlier versions (uuid.uuid5 of "kind|run|key...") stay the same
    import uuid

    namespace = uuid.UUID("6f1c2a4e-8f0d-5b7e-9a3c-2d4e6f8a0b1c")
    assert make_event_id("tasks", "r1", "t1") == str(uuid.uuid5(namespace, "tasks|r1|t1"))
    assert make_event_id("samples", "run-7", "g", 3) == str(uuid.uuid5(namespace, "samples|run-7|g|3"))
    assert make_event_id("tasks", "r", "prompt ✓ é") == str(uuid.uuid5(namespace, "tasks|r|prompt ✓ é"))
    assert uuid.UUID(make_event_id("tasks", "r1", "t1")).version == 5


@pytest.mark.parametrize(
    "garbage, message",
    [
        (b"", "empty message"),
        (b'{"json": true}', "first byte 0x7b"),
        (b"\x01\xc1", "undecodable msgpack"),
        (b"\x02not zstd", "does not decompress"),
        (b"\x01" + msgspec.msgpack.encode({"type": "task", "run_id": "r", "task_id": 5, "group_id": "g"}), "at `$.task_id`"),
        (b"\x01" + msgspec.msgpack.encode({"type": "no_such_event", "run_id": "r"}), "Invalid value 'no_such_event'"),
    ],
)
def test_garbage_gives_a_clear_error(garbage, message):
    with pytest.raises(CodecError, match=message.replace("$", r"\$").replace(".", r"\.")):
        codec.decode(garbage)


def test_newer_schema_version_is_refused():
    frame = codec.encode(Task(run_id="r", task_id="t", group_id="g", schema_version=99))
    with pytest.raises(CodecError, match="schema_version 99 is newer"):
        codec.decode(frame)


def test_run_event_kind_is_checked():
    with pytest.raises(ValueError, match=re.escape("RunEvent.kind must be one of")):
        RunEvent(run_id="r", kind="exploded")


def test_bundles_keep_frames_in_order_within_the_limit():
    frames = [bytes([codec.FRAME_PLAIN]) + bytes([i]) * 10 for i in range(5)]  # 11 bytes each
    # each frame costs its length + 5 (msgpack bin header, at most), a bundle 5 more:
    # 5 + 3 * 16 = 53 fits in 60, a fourth frame (69) does not
    values = codec.bundle(frames, 60)
    assert len(values) == 2 and values[0][0] == codec.FRAME_BUNDLE and values[1][0] == codec.FRAME_BUNDLE
    assert [f for v in values for f in codec.split_bundle(v)] == frames
    assert all(len(v) <= 60 for v in values)
    assert codec.bundle(frames[:1], 60) == frames[:1]  # a frame alone is sent as it is
    assert codec.split_bundle(frames[0]) == [frames[0]]
    assert codec.bundle([], 60) == []


def test_a_bundle_carries_events_and_malformed_bundles_are_refused():
    events = [Task(run_id="r", task_id=f"t{i}", group_id="g", sample_index=i, group_size=3) for i in range(3)]
    (value,) = codec.bundle([codec.encode(e) for e in events], 1 << 20)
    assert [codec.decode(f) for f in codec.split_bundle(value)] == events
    with pytest.raises(CodecError, match="malformed bundle"):
        codec.split_bundle(bytes([codec.FRAME_BUNDLE]) + b"\xc1")
    with pytest.raises(CodecError, match="empty bundle"):
        codec.split_bundle(bytes([codec.FRAME_BUNDLE]) + msgspec.msgpack.encode([]))
    with pytest.raises(CodecError, match="bundles do not nest"):
        codec.decode(value)


def test_threads_encode_and_decode_large_events_at_once():
    """A worker publishes from several threads at once. zstandard's compressor and
    decompressor objects are not thread safe (its documentation), and one shared by the
    module's threads failed under the cluster twin ("cannot compress: Src size is
    incorrect", a worker crash): every thread must get its events back intact."""
    import threading

    from streamrl.schema.events import Trajectory, pack_int32

    rng = np.random.default_rng(0)
    events = [
        Trajectory(
            run_id="r",
            trajectory_id=f"t{i}",
            task_id=f"t{i}",
            group_id="g",
            tokens=pack_int32(rng.integers(0, 150_000, 100_000 + i)),
        )
        for i in range(8)
    ]
    failures: list[BaseException] = []

    def round_trips():
        try:
            for _ in range(40):
                for event in events:
                    assert codec.decode(codec.encode(event)) == event
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=round_trips) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
