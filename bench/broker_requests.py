"""What a produce request costs the embedded broker: its CPU per record when each
record is its own request (a flush after every send) beside the same records batched
by the producer (the baseline), for small and trajectory-sized records.

    python bench/broker_requests.py [--records 5000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import bench_settings, fresh_run_id

from streamrl.runtime.bus import RunReader, make_producer
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema.topics import topic_name


def broker_cpu_seconds() -> float:
    """User + system CPU of the embedded broker process (tansu)."""
    import psutil

    for process in psutil.process_iter(["cmdline", "cpu_times"]):
        args = process.info["cmdline"]
        if args and Path(args[0]).name.startswith("tansu"):
            times = process.info["cpu_times"]
            return times.user + times.system
    raise SystemExit("no embedded broker process found (tansu)")


def measure(settings, size: int, per_request: bool, records: int) -> tuple[float, float]:
    """Broker CPU µs per record to produce `records` of `size` bytes, and to fetch them."""
    run_id = fresh_run_id("broker-requests")
    create_run_topics(settings, run_id)
    topic = topic_name(run_id, "samples")
    producer = make_producer(settings)
    before = broker_cpu_seconds()
    for index in range(records):
        producer.send(topic, key=str(index % 64).encode(), value=b"x" * size)
        if per_request:
            producer.flush()
    producer.flush()
    produced = broker_cpu_seconds()
    producer.close()
    reader = RunReader(settings, run_id, ["samples"], group_id=None)
    fetch_start, read = broker_cpu_seconds(), 0
    while read < records:
        events, dead = reader.poll(timeout_ms=200, max_records=5000)
        read += len(events) + len(dead)  # b"x..." is no event: every record comes back as a dead letter
    fetched = broker_cpu_seconds()
    reader.close()
    return (produced - before) / records * 1e6, (fetched - fetch_start) / records * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    args = parser.parse_args()
    settings = bench_settings()
    print(f"embedded broker CPU per record, {args.records} records")
    for size in (200, 4000):
        batched = measure(settings, size, False, args.records)
        alone = measure(settings, size, True, args.records)
        print(
            f"  {size:>5} B  batched by the producer (baseline): produce {batched[0]:6.0f} µs, fetch {batched[1]:4.0f} µs"
            f"   one record per request: produce {alone[0]:6.0f} µs, fetch {alone[1]:4.0f} µs"
            f"   ({alone[0] / max(batched[0], 1e-9):.0f}x)"
        )


if __name__ == "__main__":
    main()
