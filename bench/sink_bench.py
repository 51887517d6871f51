"""Ledger sink rows/s (Kafka -> decode -> PostgreSQL, offsets in the same transaction)
vs a raw pipelined insert of the same rows into the same PostgreSQL (target ratio >= 0.8).

Both write into tables of a fresh database, in alternating rounds, so they see the same
table and index sizes; the best round of each is reported."""

import time

from bus_bench import trajectories
from common import bench_settings, drop_database, fresh_database, fresh_run_id
from consumers.ledger_sink import WRITERS, LedgerSink
from schema.events import Trajectory
from schema.ledger import event_row
from streamrl.bus import EventPublisher, create_run_topics
from streamrl.db import connect

BATCH = 2000
ROUNDS = 3


def sink_round(settings) -> tuple[float, int]:
    run_id = fresh_run_id("sinkbench")
    create_run_topics(settings, run_id)
    events = list(trajectories(run_id))
    with EventPublisher(settings) as publisher:
        for event in events:
            publisher.publish(event)
    sink = LedgerSink(settings, run_id=run_id, max_batch=BATCH, group_id=f"bench-{run_id}")
    sink.refresh_assignment(every_s=0)
    start = time.perf_counter()
    while sink.stats.rows < len(events):
        sink.poll_once()
    elapsed = time.perf_counter() - start
    sink.close()
    return elapsed, len(events)


def raw_round(settings, table: str) -> tuple[float, int]:
    """The same rows, already built, pipelined with executemany in the same batches."""
    run_id = fresh_run_id("rawbench")
    events = list(trajectories(run_id))
    writer = WRITERS[Trajectory]
    params = [writer.params(event_row(e, "bench", 0, i)) for i, e in enumerate(events)]
    sql = writer.sql.replace("insert into trajectories", f"insert into {table}")
    with connect(settings.database_url, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(0, len(params), BATCH):
            with conn.transaction():
                conn.cursor().executemany(sql, params[i:i + BATCH])
        return time.perf_counter() - start, len(params)


def main() -> None:
    base = bench_settings()
    settings = fresh_database(base, "streamrl_sink_bench")
    try:
        with connect(settings.database_url, autocommit=True) as conn:
            conn.execute("create table raw_trajectories (like trajectories including all)")
        sink_rates, raw_rates = [], []
        for _ in range(ROUNDS):
            seconds, n = sink_round(settings)
            sink_rates.append(n / seconds)
            seconds, n = raw_round(settings, "raw_trajectories")
            raw_rates.append(n / seconds)
    finally:
        drop_database(base, settings)
    sink_rate, raw_rate = max(sink_rates), max(raw_rates)
    print(f"sink: {n:,} Trajectory rows (~3.8 KB frames) per round, batches of {BATCH}, best of {ROUNDS}")
    print(f"  ledger sink (consume, decode, insert, offsets): {sink_rate:9,.0f} rows/s"
          f"   rounds: {', '.join(f'{r:,.0f}' for r in sink_rates)}")
    print(f"  raw pipelined executemany of the same rows:     {raw_rate:9,.0f} rows/s"
          f"   rounds: {', '.join(f'{r:,.0f}' for r in raw_rates)}")
    ratio = sink_rate / raw_rate
    print(f"  ratio sink/raw: {ratio:.2f}  target >= 0.8: {'PASS' if ratio >= 0.8 else 'FAIL'}")


if __name__ == "__main__":
    main()
