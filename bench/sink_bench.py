"""Ledger sink rows/s (Kafka -> decode -> PostgreSQL, offsets in the same transaction)
vs a raw pipelined insert of the same rows into the same PostgreSQL (target ratio >= 0.8)."""

import time

from common import bench_settings, fresh_run_id
from consumers.ledger_sink import WRITERS, LedgerSink
from schema.events import Trajectory
from schema.ledger import event_row
from streamrl.bus import EventPublisher, create_run_topics
from streamrl.db import connect
from bus_bench import trajectories

BATCH = 2000


def main() -> None:
    settings = bench_settings()
    run_id = fresh_run_id("sinkbench")
    create_run_topics(settings, run_id)
    events = list(trajectories(run_id))
    n = len(events)
    with EventPublisher(settings) as publisher:
        for event in events:
            publisher.publish(event)

    sink = LedgerSink(settings, run_id=run_id, max_batch=BATCH, group_id=f"bench-{run_id}")
    sink.refresh_assignment(every_s=0)
    start = time.perf_counter()
    while sink.stats.rows < n:
        sink.poll_once()
    sink_seconds = time.perf_counter() - start
    sink.close()

    # Baseline: the very rows the sink wrote, already built, pipelined into a copy of the table.
    writer = WRITERS[Trajectory]
    params = [writer.params(event_row(e, "bench", 0, i)) for i, e in enumerate(events)]
    conn = connect(settings.database_url, autocommit=True)
    table = f"raw_{run_id.replace('-', '_')}"
    conn.execute(f"create unlogged table if not exists {table} (like trajectories including all)")
    conn.execute(f"drop table {table}")
    conn.execute(f"create table {table} (like trajectories including all)")
    sql = writer.sql.replace("insert into trajectories", f"insert into {table}")
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        with conn.transaction():
            conn.cursor().executemany(sql, params[i:i + BATCH])
    raw_seconds = time.perf_counter() - start
    conn.execute(f"drop table {table}")
    conn.close()

    sink_rate, raw_rate = n / sink_seconds, n / raw_seconds
    print(f"sink: {n:,} Trajectory rows (~3.8 KB frames), batches of {BATCH}")
    print(f"  ledger sink (consume, decode, insert, offsets): {sink_rate:9,.0f} rows/s")
    print(f"  raw pipelined executemany of the same rows:     {raw_rate:9,.0f} rows/s")
    ratio = sink_rate / raw_rate
    print(f"  ratio sink/raw: {ratio:.2f}  target >= 0.8: {'PASS' if ratio >= 0.8 else 'FAIL'}")


if __name__ == "__main__":
    main()
