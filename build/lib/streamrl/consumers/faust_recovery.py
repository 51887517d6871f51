"""A watch on faust's table recovery: a changelog partition whose recovery stops making
progress is read again from where it stood, and if that does not help either, the
processor stops with one sentence so that its supervisor (`streamrl run`, a Kubernetes
Deployment) starts a fresh one.

Why: in one CI run of the two-processor SIGKILL test (tests/test_processor_group.py),
after the rebalance that followed the restart, a processor's recovery of two changelog
partitions received no record for minutes while its fetch requests went out ("No event
received for active tp ... since recovery start"). faust waits for ever there, and the
groups of those partitions never close. Recovery reads at most a few thousand small
markers, so a partition that is behind and has delivered nothing for `RECOVERY_STALL_S`
is stuck, not slow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping

log = logging.getLogger("streamrl.processor")

RECOVERY_STALL_S = 20.0


class RecoveryStalled(RuntimeError):
    """The processor's table recovery stayed stuck after it was read again: restart it."""


def stalled_partitions(
    remaining: Mapping[Hashable, int], received_at: Mapping[Hashable, float], started_at: float, now: float, stall_s: float
) -> list:
    """The changelog partitions still behind their highwater (`remaining` > 0) that have
    delivered nothing for `stall_s`: since their last record, or since recovery started
    for one that has delivered none."""
    return sorted(
        (tp for tp, left in remaining.items() if left > 0 and now - max(started_at, received_at.get(tp, started_at)) >= stall_s),
        key=str,
    )


class RecoveryWatch:
    """Called every few seconds from the processor's event loop. A stalled partition is
    sought again to the offset recovery stands at, with the consumer's read-offset
    filter for it cleared and the partition resumed; if it is still stalled `stall_s`
    later, `check` raises RecoveryStalled."""

    def __init__(self, app, stall_s: float = RECOVERY_STALL_S):
        self.app, self.stall_s = app, stall_s
        self.recovery_started_at: float | None = None
        self.read_again_at: dict = {}  # partition -> when it was sought again, this recovery

    async def check(self, now: float | None = None) -> None:
        recovery = self.app.tables.recovery
        started_at = recovery._recovery_started_at
        if not recovery.in_recovery or started_at is None:
            self.recovery_started_at, self.read_again_at = None, {}
            return
        if started_at != self.recovery_started_at:  # a new recovery (a rebalance): a fresh start
            self.recovery_started_at, self.read_again_at = started_at, {}
        now = time.monotonic() if now is None else now
        stalled = stalled_partitions(
            recovery.active_remaining(), recovery._active_events_received_at, started_at, now, self.stall_s
        )
        for tp in stalled:
            read_again_at = self.read_again_at.get(tp)
            if read_again_at is None:
                await self._read_again(tp, max(recovery.active_offsets.get(tp) or 0, 0))
                self.read_again_at[tp] = now
            elif now - read_again_at >= self.stall_s:
                raise RecoveryStalled(
                    f"the processor's table recovery of {tp.topic}[{tp.partition}] received nothing for "
                    f"{now - started_at:.0f} s, also after reading it again: stopping, so that a restarted "
                    "processor recovers it afresh"
                )

    async def _read_again(self, tp, offset: int) -> None:
        log.warning(
            "table recovery of %s[%d] received nothing for %.0f s: reading it again from offset %d",
            tp.topic,
            tp.partition,
            self.stall_s,
            offset,
        )
        consumer = self.app.consumer
        consumer._read_offset.pop(tp, None)  # records below a stale read offset would be dropped
        await consumer.seek(tp, offset)
        consumer.resume_partitions([tp])
