"""Ledger sink rows/s (Kafka -> decode -> PostgreSQL, offsets in the same transaction)
vs raw inserts of the same, already built rows into the same PostgreSQL (target ratio
>= 0.8): a plain binary COPY (the fastest way in, and the target's baseline), a text
COPY (what the sink used before it went binary) and a pipelined
`executemany` of one INSERT per row (what the sink did before it used COPY).
The sink reads the rows twice over: one trajectory a Kafka record, and a group's 8
trajectories a record (a bundle, as a worker sends them in a run).

All write into tables of a fresh database, in alternating rounds, so they see the same
table and index sizes; the best round of each is reported."""

import time

from bus_bench import trajectories
from common import bench_settings, drop_database, fresh_database, fresh_run_id
from psycopg.types.json import Jsonb, set_json_dumps

from streamrl.consumers.ledger_sink import LedgerSink
from streamrl.consumers.ledger_writes import WRITERS, json_dumps
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.db import connect
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema.events import Trajectory
from streamrl.schema.ledger import event_row

BATCH = 2000
ROUNDS = 3


def sink_round(settings, bundle: bool = False) -> tuple[float, int]:
    run_id = fresh_run_id("sinkbench")
    create_run_topics(settings, run_id)
    events = list(trajectories(run_id))
    with EventPublisher(settings, bundle=bundle) as publisher:
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


def new_run(settings, prefix: str) -> str:
    """A run id with its `runs` row, so its rollout tables exist (migration 0019): the
    sink makes the row in its first batch; the raw rounds make it before their clock."""
    run_id = fresh_run_id(prefix)
    with connect(settings.database_url, autocommit=True) as conn:
        conn.execute("insert into runs (run_id) values (%s)", (run_id,))
    return run_id


def raw_rows(run_id: str) -> list[tuple]:
    writer = WRITERS[Trajectory]
    return [writer.params(event_row(e, "bench", 0, i)) for i, e in enumerate(trajectories(run_id))]


def wrapped(rows: list[tuple]) -> list[tuple]:
    """Rows whose JSON values carry their wrapper: values adapted by Python type (an
    INSERT's parameters, a text COPY without column types) need it."""
    writer = WRITERS[Trajectory]
    is_json = [c in writer.json_columns for c in writer.columns]
    return [tuple(Jsonb(v, dumps=json_dumps) if j and v is not None else v for v, j in zip(row, is_json)) for row in rows]


def raw_copy_round(settings, table: str, binary: bool) -> tuple[float, int]:
    """The same rows COPYed straight into the table, in the same batches (binary: with
    the column types set, as the sink does; text: PostgreSQL's text format)."""
    rows = raw_rows(new_run(settings, "rawcopy"))
    rows = rows if binary else wrapped(rows)
    writer = WRITERS[Trajectory]
    sql = f"copy {table} ({', '.join(writer.columns)}) from stdin" + (" (format binary)" if binary else "")
    with connect(settings.database_url, autocommit=True) as conn:
        set_json_dumps(json_dumps, conn)  # the sink's JSON encoder
        start = time.perf_counter()
        for i in range(0, len(rows), BATCH):
            with conn.transaction(), conn.cursor().copy(sql) as copy:
                if binary:
                    copy.set_types(writer.types)
                for row in rows[i : i + BATCH]:
                    copy.write_row(row)
        return time.perf_counter() - start, len(rows)


def raw_executemany_round(settings, table: str) -> tuple[float, int]:
    """The same rows, one prepared INSERT each, pipelined with executemany."""
    rows = wrapped(raw_rows(new_run(settings, "rawmany")))
    columns = WRITERS[Trajectory].columns
    sql = (
        f"insert into {table} ({', '.join(columns)}) values ({', '.join(['%s'] * len(columns))}) "
        "on conflict (run_id, event_id) do nothing"
    )
    with connect(settings.database_url, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(0, len(rows), BATCH):
            with conn.transaction():
                conn.cursor().executemany(sql, rows[i : i + BATCH])
        return time.perf_counter() - start, len(rows)


def main() -> None:
    base = bench_settings()
    settings = fresh_database(base, "streamrl_sink_bench")
    try:
        with connect(settings.database_url, autocommit=True) as conn:
            conn.execute("create table raw_copy (like trajectories including all)")
            conn.execute("create table raw_text_copy (like trajectories including all)")
            conn.execute("create table raw_many (like trajectories including all)")
        rates: dict[str, list[float]] = {"sink": [], "sink_bundled": [], "copy": [], "text_copy": [], "executemany": []}
        for _ in range(ROUNDS):
            for name, measure in (
                ("sink", lambda: sink_round(settings)),
                ("sink_bundled", lambda: sink_round(settings, bundle=True)),
                ("copy", lambda: raw_copy_round(settings, "raw_copy", binary=True)),
                ("text_copy", lambda: raw_copy_round(settings, "raw_text_copy", binary=False)),
                ("executemany", lambda: raw_executemany_round(settings, "raw_many")),
            ):
                seconds, n = measure()
                rates[name].append(n / seconds)
    finally:
        drop_database(base, settings)
    best = {name: max(values) for name, values in rates.items()}
    print(f"sink: {n:,} Trajectory rows (~3.8 KB frames) per round, batches of {BATCH}, best of {ROUNDS}")
    labels = {
        "sink": "ledger sink (consume, decode, COPY, offsets)",
        "sink_bundled": "ledger sink, a group's 8 trajectories a record",
        "copy": "raw binary COPY of the same rows",
        "text_copy": "raw text COPY of the same rows",
        "executemany": "raw pipelined executemany, same rows",
    }
    for name, label in labels.items():
        print(f"  {label:<46} {best[name]:9,.0f} rows/s   rounds: {', '.join(f'{r:,.0f}' for r in rates[name])}")
    for name in ("sink", "sink_bundled"):
        ratio = best[name] / best["copy"]
        print(f"  ratio {name}/raw binary COPY: {ratio:.2f}  target >= 0.8: {'PASS' if ratio >= 0.8 else 'FAIL'}")
    print(
        f"  (sink/raw text COPY: {best['sink'] / best['text_copy']:.2f})"
        f"   (sink/raw executemany: {best['sink'] / best['executemany']:.2f})"
    )


if __name__ == "__main__":
    main()
