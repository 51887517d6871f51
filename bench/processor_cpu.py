"""The stream processor's CPU per rollout: the faust app (consumer group, closed-group
table) beside the plain loop over assigned partitions (STREAMRL_PARTITION_ASSIGNMENT=
shard, the baseline), each as the `streamrl processor` process on the same stream.

Each processor is started, warmed up on one group, then fed GROUPS groups of SIZE
(trajectory + evaluation per rollout); its CPU time (psutil) is read before and
after, so start-up and imports are not counted.

    python bench/processor_cpu.py [--groups 400]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import bench_settings, fresh_run_id

from streamrl.producers.publisher import create_run
from streamrl.runtime.bus import EventPublisher, RunReader
from streamrl.runtime.config import Recipe
from tests.test_processor_group import SIZE, group_events

REPO = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def wait_for_outputs(reader: RunReader, seen: set, expected: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while len(seen) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {expected} outputs after {timeout_s} s")
        events, _ = reader.poll(timeout_ms=200)
        seen.update(event.event_id for event, _, _ in events)


def outputs_of(groups: range) -> int:
    """Samples, plus one record per filtered group (every third has equal rewards)."""
    return sum(1 if g % 3 == 0 else SIZE for g in groups)


def measure(settings, assignment: str, groups: int) -> float:
    run_id = fresh_run_id(f"proc-{assignment}")
    with EventPublisher(settings) as publisher:
        create_run(settings, run_id, Recipe(), publisher)
    env = {**os.environ, "STREAMRL_PARTITION_ASSIGNMENT": assignment, "STREAMRL_HOME": str(settings.home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "processor", run_id],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    reader = RunReader(settings, run_id, ["samples"], group_id=None)
    seen: set = set()
    try:
        with EventPublisher(settings) as publisher:
            for event in group_events(run_id, 1):  # warm-up: a group that teaches
                publisher.publish(event)
        wait_for_outputs(reader, seen, SIZE)
        before = cpu_seconds(process.pid)
        with EventPublisher(settings) as publisher:
            for g in range(2, groups + 2):
                for event in group_events(run_id, g):
                    publisher.publish(event)
        wait_for_outputs(reader, seen, SIZE + outputs_of(range(2, groups + 2)))
        return (cpu_seconds(process.pid) - before) / (groups * SIZE)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=400)
    args = parser.parse_args()
    settings = bench_settings()
    loop = measure(settings, "shard", args.groups)
    faust = measure(settings, "group", args.groups)
    print(f"processor CPU per rollout, {args.groups} groups of {SIZE} (trajectory + evaluation each)")
    print(f"  plain loop, assigned partitions (baseline)  {loop * 1000:8.3f} ms")
    print(f"  faust app, consumer group, closed-group table{faust * 1000:8.3f} ms   ({faust / loop:.2f}x)")


if __name__ == "__main__":
    main()
