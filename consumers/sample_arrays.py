"""Which trajectories' packed arrays the ledger holds, so that a sample carrying the same
bytes is stored without them (migration 0020).

A sample repeats its trajectory's tokens, loss mask, logprobs and per-token versions:
the learner reads them from the samples topic. In the ledger that second copy was about
half of all bytes. The sink remembers a digest of the arrays of each trajectory it has
written and committed itself, through the plain COPY (a batch that repeated an event the
ledger held keeps the first copy, which may differ: nothing of it is remembered), and
of those its current transaction has so written (they commit or roll back with the
sample). A sample whose arrays hash the same as its trajectory's is stored with NULL
arrays and `arrays_in_trajectory` true; any other (its trajectory unseen, written by
another sink or before a restart, or arrays that differ) keeps its own. The digest is
BLAKE2b-128 over each array with its length, so a forged sample cannot pass for its
trajectory.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from streamrl.schema.events import Sample, Trajectory
from streamrl.schema.ledger import SAMPLE_ARRAYS

# Trajectories remembered: 280 bytes each measured with one run id object shared, about
# 370 with each its own (as decoded), so about 19 MB; 12 minutes of 64 H100s' stream.
REMEMBERED = 50_000


def arrays_digest(event: Trajectory | Sample) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for name in SAMPLE_ARRAYS:
        value = getattr(event, name)
        digest.update(b"\xff" if value is None else len(value).to_bytes(8, "little"))
        digest.update(value or b"")
    return digest.digest()


class TrajectoryArrays:
    """Digests of committed trajectories' arrays by (run, trajectory id), the newest
    `capacity` of them."""

    def __init__(self, capacity: int = REMEMBERED):
        self.capacity = capacity
        self._digests: OrderedDict[tuple[str, str], bytes] = OrderedDict()

    def remember(self, trajectories: dict[tuple[str, str], bytes]) -> None:
        """Trajectories the ledger now holds exactly as given (`digests`; call after the
        commit)."""
        self._digests.update(trajectories)
        while len(self._digests) > self.capacity:
            self._digests.popitem(last=False)

    def held(self, sample: Sample, in_batch: dict[tuple[str, str], bytes]) -> bool:
        """Whether the sample's arrays are its trajectory's, as the ledger holds them or
        as `in_batch` (written whole in the sample's own transaction) does."""
        key = (sample.run_id, sample.trajectory_id)
        known = in_batch.get(key) or self._digests.get(key)
        return known is not None and known == arrays_digest(sample)


def digests(trajectories: list[Trajectory]) -> dict[tuple[str, str], bytes]:
    return {(t.run_id, t.trajectory_id): arrays_digest(t) for t in trajectories}
