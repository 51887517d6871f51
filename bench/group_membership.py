"""Consumer-group membership on the broker in use (by default the embedded one): the
time a member restarted after a SIGKILL takes to read again, static membership
(KIP-345, a group.instance.id) beside dynamic, for kafka-python (the rollout workers'
client) and faust (the processor's), over the same killed-while-joining trials.

    python bench/group_membership.py [--trials 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import bench_settings

from tests.helpers.group_wedge import run_trials


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    settings = bench_settings()
    workdir = Path(tempfile.mkdtemp(prefix="group-bench-"))
    print(f"{args.trials} trials each: two members, one SIGKILLed 0.3-4 s after start and restarted")
    print(f"{'client':<14}{'membership':<12}{'finished':>9}{'all read (s)':>16}{'rejoin median (s)':>19}{'rejoin max (s)':>16}")
    for client in ("kafka-python", "faust"):
        for static in (False, True):
            trials = run_trials(settings, workdir, client, static, args.trials, records=2000, concurrent=2)
            rejoin = [t.rejoin_s for t in trials if t.rejoin_s is not None]
            done = sum(t.finished for t in trials)
            whole = statistics.median(t.seconds for t in trials)
            print(
                f"{client:<14}{'static' if static else 'dynamic':<12}{done:>6}/{len(trials):<2}{whole:>16.1f}"
                f"{statistics.median(rejoin) if rejoin else float('nan'):>19.1f}"
                f"{max(rejoin) if rejoin else float('nan'):>16.1f}",
                flush=True,
            )
    print(
        "all read: median seconds from the first start to the last record read; rejoin: the restarted "
        "member's start to its first record (the baseline is the dynamic row of the same client)"
    )


if __name__ == "__main__":
    main()
