"""A sample's packed arrays are kept once, in its trajectory's row, where they are the
same bytes (migration 0020, consumers/sample_arrays.py), against the machine's
PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL, as CI sets it). What matters to a user:
every sample reads back whole (`samples_with_arrays`, recovery), whatever was stored."""

from __future__ import annotations

import os
import uuid

import msgspec
import pytest
from kafka import TopicPartition

from streamrl.consumers.ledger_writes import Placed, create_staging_tables, write_batch
from streamrl.consumers.sample_arrays import TrajectoryArrays
from streamrl.producers.synthetic import synthetic_sample, synthetic_trajectory
from streamrl.runtime import db
from streamrl.schema.events import Sample, pack_float32, unpack_float32
from streamrl.schema.ledger import query_events
from tests.conftest import external_ledger

EXTERNAL_URL = os.environ.get("STREAMRL_TEST_EXTERNAL_DATABASE_URL")
pytestmark = pytest.mark.skipif(not EXTERNAL_URL, reason="needs an external PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL)")


@pytest.fixture(scope="module")
def ledger_url():
    with external_ledger("streamrl_sample_arrays") as url:
        yield url


class Sink:
    """The sink's write path, one batch at a time, offsets counting up."""

    def __init__(self, conn):
        self.conn, self.arrays, self.offset = conn, TrajectoryArrays(), 0
        create_staging_tables(conn)

    def write(self, *events) -> list:
        placed = []
        for event in events:
            placed.append(Placed(event, "t", 0, self.offset))
            self.offset += 1
        return write_batch(self.conn, placed, [], "test-sink", {TopicPartition("t", 0): self.offset}, self.arrays)


def stored(conn, run_id: str) -> dict[str, tuple[bool, bool]]:
    """Per sample: (its arrays are NULL in the table, it says they are its trajectory's)."""
    rows = conn.execute(
        "select trajectory_id, tokens is null and loss_mask is null and logprobs is null, arrays_in_trajectory "
        "from samples where run_id = %s",
        (run_id,),
    )
    return {trajectory_id: (empty, flagged) for trajectory_id, empty, flagged in rows}


def read_back(conn, run_id: str) -> dict[str, Sample]:
    samples = query_events(conn, Sample, "select * from samples_with_arrays where run_id = %s", (run_id,))
    return {s.trajectory_id: s for s in samples}


def fields(sample: Sample) -> dict:
    """Every field; the time to the microsecond, as PostgreSQL keeps it."""
    return {**msgspec.structs.asdict(sample), "created_at": round(sample.created_at, 6)}


def same(a: Sample, b: Sample) -> bool:
    return fields(a) == fields(b)


def test_a_sample_after_its_trajectory_is_stored_once_and_reads_back_whole(ledger_url):
    run_id = f"once-{uuid.uuid4().hex[:8]}"
    trajectories = [synthetic_trajectory(run_id, i) for i in range(4)]
    samples = [synthetic_sample(run_id, i) for i in range(4)]
    with db.connect(ledger_url, autocommit=True) as conn:
        sink = Sink(conn)
        assert sink.write(*trajectories) == []
        assert sink.write(*samples) == []
        assert set(stored(conn, run_id).values()) == {(True, True)}
        back = read_back(conn, run_id)
    assert all(same(back[s.trajectory_id], s) for s in samples)  # every field, the arrays included


def test_a_sample_whose_arrays_differ_from_its_trajectorys_keeps_its_own(ledger_url):
    run_id = f"forged-{uuid.uuid4().hex[:8]}"
    trajectory, sample = synthetic_trajectory(run_id, 0), synthetic_sample(run_id, 0)
    logprobs = unpack_float32(sample.logprobs).copy()
    logprobs[-1] += 0.5
    forged = msgspec.structs.replace(sample, logprobs=pack_float32(logprobs))
    with db.connect(ledger_url, autocommit=True) as conn:
        sink = Sink(conn)
        sink.write(trajectory)
        sink.write(forged)
        assert stored(conn, run_id) == {sample.trajectory_id: (False, False)}
        assert same(read_back(conn, run_id)[sample.trajectory_id], forged)


def test_samples_keep_their_arrays_unless_their_trajectory_is_written_as_it_is(ledger_url):
    """A trajectory unseen by this sink (written before a restart), or written through the
    staged path (a repeat: the ledger kept the first copy, which may differ): its sample
    keeps its own arrays. In the same batch, the sample before its trajectory, it does
    not: they commit together."""
    run_id = f"kept-{uuid.uuid4().hex[:8]}"
    with db.connect(ledger_url, autocommit=True) as conn:
        sink = Sink(conn)
        sink.write(synthetic_sample(run_id, 0), synthetic_trajectory(run_id, 0))  # one batch
        sink.write(synthetic_trajectory(run_id, 1))
        restarted = Sink(conn)
        restarted.write(synthetic_sample(run_id, 1))
        first = synthetic_trajectory(run_id, 2)
        restarted.write(first)
        again = msgspec.structs.replace(first, logprobs=synthetic_trajectory(run_id, 3).logprobs)
        restarted.write(again, synthetic_trajectory(run_id, 4))  # a repeat in the batch: the staged path
        restarted.write(msgspec.structs.replace(synthetic_sample(run_id, 2), logprobs=again.logprobs))
        restarted.write(synthetic_sample(run_id, 4))
        kept = stored(conn, run_id)
        back = read_back(conn, run_id)
    once = synthetic_sample(run_id, 0).trajectory_id
    assert kept.pop(once) == (True, True)
    assert kept == dict.fromkeys(kept, (False, False)) and len(kept) == 3
    assert unpack_float32(back[first.trajectory_id].logprobs).tolist() == unpack_float32(again.logprobs).tolist()


def test_recovery_reads_every_sample_whole(ledger_url):
    """What `streamrl run --resume` re-publishes when the broker has lost its topics."""
    from streamrl.recovery import SAMPLES_OF_GROUPS

    run_id = f"recover-{uuid.uuid4().hex[:8]}"
    samples = [synthetic_sample(run_id, i) for i in range(3)]
    with db.connect(ledger_url, autocommit=True) as conn:
        sink = Sink(conn)
        sink.write(*(synthetic_trajectory(run_id, i) for i in range(2)))
        sink.write(*samples)  # two stored once, the third whole (its trajectory unseen)
        assert sorted(stored(conn, run_id).values()) == [(False, False), (True, True), (True, True)]
        groups = sorted({s.group_id for s in samples})
        republished = query_events(conn, Sample, SAMPLES_OF_GROUPS, (run_id, groups))
    key = lambda s: s.trajectory_id  # noqa: E731
    assert [fields(s) for s in sorted(republished, key=key)] == [fields(s) for s in sorted(samples, key=key)]
