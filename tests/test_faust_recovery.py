"""The watch on faust's table recovery (consumers/faust_recovery.py): which changelog
partitions count as stalled, and what is done about them, on a real faust app's
Recovery service (never started: no broker is needed to hold its offsets)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import faust
import pytest
from faust.types import TP

from streamrl.consumers.faust_recovery import RecoveryStalled, RecoveryWatch, stalled_partitions

A, B, C = TP("cl", 0), TP("cl", 1), TP("cl", 2)


def test_stalled_partitions_by_hand():
    # started at 100, now 130, stall 20 s. A: behind, last record at 125 -> 5 s quiet: not
    # stalled. B: behind, nothing received -> 30 s since start: stalled. C: caught up.
    assert stalled_partitions({A: 4, B: 2, C: 0}, {A: 125.0}, started_at=100.0, now=130.0, stall_s=20.0) == [B]
    # A's last record at 109 -> 21 s quiet: stalled too; a record from before this
    # recovery started (90) counts from the start (30 s)
    assert stalled_partitions({A: 4, B: 2}, {A: 109.0, B: 90.0}, 100.0, 130.0, 20.0) == [A, B]
    # 19 s after the start nothing is stalled yet
    assert stalled_partitions({A: 4, B: 2}, {}, 100.0, 119.0, 20.0) == []


class SeekRecorder:
    """Stands in for the started Kafka consumer: records what the watch asks of it."""

    def __init__(self):
        self._read_offset = {A: 9, B: 5}
        self.calls = []

    async def seek(self, tp, offset):
        self.calls.append(("seek", tp, offset))

    def resume_partitions(self, tps):
        self.calls.append(("resume", *tps))


def test_a_stalled_partition_is_read_again_then_the_processor_stops():
    app = faust.App("recovery-watch-test", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False)
    recovery = app.tables.recovery
    recovery.active_highwaters[A], recovery.active_highwaters[B] = 10, 10  # Counters: set, not update
    recovery.active_offsets[A], recovery.active_offsets[B] = 6, -1
    consumer = SeekRecorder()
    watch = RecoveryWatch(SimpleNamespace(tables=app.tables, consumer=consumer), stall_s=20.0)

    asyncio.run(watch.check(now=1e6))  # not in recovery: nothing to do
    assert consumer.calls == []

    recovery._set_recovery_started()
    start = recovery._recovery_started_at
    recovery._active_events_received_at[A] = start + 15.0  # A delivered a record 15 s in
    asyncio.run(watch.check(now=start + 25.0))  # B has been quiet 25 s, A 10 s
    assert consumer.calls == [("seek", B, 0), ("resume", B)]  # offset -1: from the start
    assert B not in consumer._read_offset and consumer._read_offset[A] == 9

    asyncio.run(watch.check(now=start + 36.0))  # A quiet 21 s: read again; B not yet 20 s since
    assert consumer.calls[2:] == [("seek", A, 6), ("resume", A)]

    with pytest.raises(RecoveryStalled, match=r"cl\[1\] received nothing for 45 s"):
        asyncio.run(watch.check(now=start + 45.0))  # B quiet 20 s after it was read again

    recovery._set_recovery_started()  # a new recovery (a rebalance) starts afresh
    asyncio.run(watch.check(now=recovery._recovery_started_at + 25.0))
    assert consumer.calls[4:] == [("seek", A, 6), ("resume", A), ("seek", B, 0), ("resume", B)]

    recovery.active_offsets[A], recovery.active_offsets[B] = 10, 10  # caught up: nothing is stalled
    consumer.calls.clear()
    asyncio.run(watch.check(now=recovery._recovery_started_at + 100.0))
    assert consumer.calls == []


def test_a_stalled_recovery_is_one_sentence_and_exit_1_which_the_supervisor_restarts():
    from streamrl.cli.common import EXIT_FAILED, as_cli_error
    from streamrl.supervise import NOT_RETRIED

    error = as_cli_error(RecoveryStalled("the processor's table recovery of cl[1] received nothing for 45 s"))
    assert error is not None and error.exit_code == EXIT_FAILED == 1 and EXIT_FAILED not in NOT_RETRIED
    assert str(error) == "the processor's table recovery of cl[1] received nothing for 45 s"
