"""Fuzzing the two doors that take outside input: the event decoder (every record a
consumer reads) and the recipe loader (every YAML a user writes). Arbitrary bytes or
YAML must give a clear error (a CodecError, which consumers turn into a dead letter; a
RecipeError naming the file), never another exception, and never hang."""

from __future__ import annotations

import os
from types import SimpleNamespace

import msgspec
import yaml
import zstandard
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from streamrl.runtime.bus import unframe, unframe_record
from streamrl.runtime.recipe import RecipeError, load_recipe
from streamrl.schema import codec
from streamrl.schema.codec import CodecError
from streamrl.schema.events import Event

FAST = hsettings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 400)),
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.too_slow],
)

# msgpack-able values: what a foreign producer could put on a topic
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)
event_tags = st.sampled_from(
    [
        "task",
        "trajectory",
        "evaluation",
        "sample",
        "group_filtered",
        "train_step",
        "weight_version",
        "run",
        "dead_letter",
        "nonsense",
    ]
)
event_like = st.builds(
    lambda tag, fields: {"type": tag, **fields},
    event_tags,
    st.dictionaries(
        st.sampled_from(
            [
                "run_id",
                "event_id",
                "schema_version",
                "created_at",
                "task_id",
                "group_id",
                "tokens",
                "step",
                "reward",
                "trajectory_id",
                "prompt",
                "logprobs",
                "version",
                "kind",
            ]
        ),
        values,
    ),
)


def decodes_or_refuses(data: bytes) -> None:
    try:
        event = codec.decode(data)
    except CodecError as exc:
        assert str(exc)
        return
    assert isinstance(event, Event)


@given(st.binary(max_size=2048))
@FAST
def test_arbitrary_bytes_decode_or_give_a_codec_error(data):
    decodes_or_refuses(data)
    decodes_or_refuses(bytes([codec.FRAME_PLAIN]) + data)
    decodes_or_refuses(bytes([codec.FRAME_ZSTD]) + data)


@given(event_like)
@FAST
def test_event_shaped_msgpack_decodes_or_gives_a_codec_error(obj):
    body = msgspec.msgpack.encode(obj)
    decodes_or_refuses(bytes([codec.FRAME_PLAIN]) + body)
    decodes_or_refuses(bytes([codec.FRAME_ZSTD]) + zstandard.ZstdCompressor().compress(body))


@given(st.binary(max_size=512))
@FAST
def test_what_a_consumer_reads_is_an_event_or_a_dead_letter_reason(data):
    """`RunReader.poll` turns exactly CodecError, LookupError and ValueError into dead letters."""
    try:
        unframe(data, None)
    except (CodecError, LookupError, ValueError):
        pass


@given(st.lists(st.binary(max_size=256), max_size=6) | st.binary(max_size=512))
@FAST
def test_a_bundle_of_anything_gives_events_or_one_dead_letter_with_the_reasons(frames):
    """What `unframe_record` makes of a record: every frame an event or a reason."""
    value = bytes([codec.FRAME_BUNDLE]) + (msgspec.msgpack.encode(frames) if isinstance(frames, list) else frames)
    record = SimpleNamespace(topic="streamrl.r.tasks", partition=0, offset=7, key=b"k", value=value)
    events, dead = unframe_record(record, "r", "fuzz", None)
    assert all(isinstance(e, Event) for e in events) and len(dead) <= 1
    if dead:
        assert dead[0].error and dead[0].raw == value and dead[0].source_offset == 7
    else:
        assert len(events) == len(codec.split_bundle(value))


def test_a_zstd_frame_that_claims_a_huge_size_is_refused_without_allocating_it():
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (codec.MAX_DECOMPRESSED_BYTES + 1))
    try:
        codec.decode(bytes([codec.FRAME_ZSTD]) + bomb)
    except CodecError as exc:
        assert "over the limit" in str(exc)
    else:
        raise AssertionError("a frame over the limit was decoded")


def test_a_dead_letter_for_a_record_of_any_size_fits_a_message_and_says_what_it_left_out():
    """A 1,100,000-byte garbage record: its dead letter keeps the first 64 KiB, names the
    record's size and hash, and frames within the broker limit, so dead-lettering it
    cannot fail and the reader's offset moves past it."""
    import hashlib

    from streamrl.runtime.bus import frame
    from streamrl.runtime.dead_letters import DEAD_LETTER_RAW_BYTES
    from streamrl.runtime.settings import Settings

    value = b"\xc1" * 1_100_000
    record = SimpleNamespace(topic="streamrl.r1.trajectories", partition=0, offset=9, key=b"k" * 5000, value=value)
    events, dead = unframe_record(record, "r1", "processor", None)
    assert events == [] and len(dead) == 1
    letter = dead[0]
    assert letter.raw == value[:DEAD_LETTER_RAW_BYTES] and len(letter.key) == 1024
    assert f"the record's value is 1,100,000 bytes, sha256 {hashlib.sha256(value).hexdigest()}" in letter.error
    assert "the record's key is 5,000 bytes" in letter.error
    limit = Settings.from_env().max_message_bytes
    assert len(frame(letter, limit, None)) < limit


def test_an_event_on_another_runs_topic_or_of_another_kind_is_a_dead_letter():
    from streamrl.schema.events import Task

    task = codec.encode(Task(run_id="r2", task_id="t", group_id="g"))
    _, dead = unframe_record(
        SimpleNamespace(topic="streamrl.r1.tasks", partition=0, offset=1, key=None, value=task), "r1", "worker", None
    )
    assert "event of run 'r2' on a topic of run 'r1'" in dead[0].error
    _, dead = unframe_record(
        SimpleNamespace(topic="streamrl.r2.samples", partition=0, offset=1, key=None, value=task), "r2", "learner", None
    )
    assert "Task event on a samples topic" in dead[0].error


SINK_DECODES_BOMBS = """
import resource, sys
from types import SimpleNamespace
from streamrl.consumers.ledger_sink import decode_record
bomb = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for offset in range(20):
    record = SimpleNamespace(topic="streamrl.r1.trajectories", partition=0, offset=offset, key=None, value=bomb)
    events, dead = decode_record(record, None)
    assert not events and len(dead) == 1
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_the_sink_reading_compression_bombs_grows_by_less_than_256_mib(tmp_path):
    """20 records of a few KB that expand to just under the frame limit: the sink's
    decoder refuses each, and its peak memory grows by less than 256 MiB (215 MiB measured
    with the 64 MiB limit; with the old 512 MiB limit one 32 KB record cost the sink
    1.18 GB, so raising the limit fails this test)."""
    import subprocess
    import sys

    bomb = tmp_path / "bomb"
    # a task whose run id is one long string: decoded, it is held twice (bytes and str)
    payload = msgspec.msgpack.encode(
        {"type": "task", "run_id": "r" * (codec.MAX_DECOMPRESSED_BYTES - 1024), "task_id": "t", "group_id": "g"}
    )
    bomb.write_bytes(bytes([codec.FRAME_ZSTD]) + zstandard.ZstdCompressor(level=19).compress(payload))
    grown_kib = int(
        subprocess.run([sys.executable, "-c", SINK_DECODES_BOMBS, str(bomb)], capture_output=True, text=True, check=True).stdout
    )
    assert grown_kib * 1024 < 256 * 2**20, grown_kib


# --- the recipe loader ---------------------------------------------------------------------

recipe_keys = st.sampled_from(
    [
        "experiment_name",
        "data",
        "rollout_worker",
        "trainer",
        "algorithm",
        "weight",
        "validate",
        "service",
        "trajectory_pool",
        "environment",
        "defaults",
        "logger",
        "replay",
        "model_path",
        "batch_size",
        "total_train_steps",
        "type",
        "max_retries",
    ]
)
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(recipe_keys | st.text(max_size=8), inner, max_size=5),
    max_leaves=25,
)


def loads_or_refuses(path) -> None:
    try:
        load_recipe(path)
    except RecipeError as exc:
        assert str(path.name) in str(exc.path) and exc.problems
        assert all(isinstance(p, str) and p for p in exc.problems)


@given(st.text(max_size=400))
@hsettings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)),
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_arbitrary_text_as_a_recipe_gives_a_recipe_error(tmp_path, text):
    path = tmp_path / "fuzzed.yaml"
    path.write_text(text)
    loads_or_refuses(path)


@given(st.dictionaries(recipe_keys, yaml_values, max_size=8))
@hsettings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)),
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_recipe_shaped_yaml_loads_or_gives_a_recipe_error(tmp_path, mapping):
    path = tmp_path / "fuzzed.yaml"
    path.write_text(yaml.safe_dump(mapping))
    loads_or_refuses(path)
