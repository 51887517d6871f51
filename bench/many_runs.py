"""What each run's own rollout tables (migration 0019) cost a ledger that keeps many
runs: the time a new run's tables take to create (inside the sink's first transaction
of the run), and the planning and execution time of a query that names its run and of
one over every run, as the runs grow.

A fresh database gets runs one at a time (each a `runs` row, so its tables come from
the trigger, as in a training run) and one trajectory each; at each checkpoint the two
queries run five times and the median is printed. "new run" is the median of the last
50 runs' first write (a trajectory, and in the new layout the run's tables). The
baseline in the same run is the shared layout of migration 0018.

    python bench/many_runs.py [--runs 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from alembic import command
from common import bench_settings, drop_database, fresh_database
from ledger_bytes import rollout

from streamrl.consumers.ledger_writes import Placed, create_staging_tables, insert_events
from streamrl.runtime import db

NAMED = "select count(*), sum(num_tokens) from trajectories where run_id = %s"
EVERY = "select count(*), sum(num_tokens) from trajectories"


def timed(conn, sql: str, params: tuple = ()) -> tuple[float, float]:
    """(planning ms, execution ms) of one EXPLAIN ANALYZE."""
    lines = [row[0] for row in conn.execute(f"explain (analyze, timing off, summary on) {sql}", params)]
    values = {line.split(":")[0].strip(): float(line.split(":")[1].split()[0]) for line in lines if " Time:" in line}
    return values["Planning Time"], values["Execution Time"]


def medians(conn, sql: str, params: tuple = ()) -> tuple[float, float]:
    runs = [timed(conn, sql, params) for _ in range(5)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def measure(settings, layout: str, runs: int) -> None:
    fresh = fresh_database(settings, f"streamrl_many_runs_{layout.replace(' ', '_')}")
    checkpoints = sorted({1, 10, 100, *range(250, runs + 1, 250), runs})
    try:
        if layout == "shared":  # the layout before migration 0019: the baseline
            command.downgrade(db.alembic_config(fresh.database_url), "0018")
        with db.connect(fresh.database_url, autocommit=True) as conn:
            create_staging_tables(conn)
            rng, creating = np.random.default_rng(0), []
            for index in range(1, runs + 1):
                trajectory = rollout(f"run-{index:06d}", index, rng)[0]
                started = time.perf_counter()
                with conn.transaction():
                    insert_events(conn, [Placed(trajectory, "bench", 0, index)])
                creating.append(time.perf_counter() - started)
                if index in checkpoints:
                    conn.execute("analyze")
                    named = medians(conn, NAMED, (f"run-{index // 2 + 1:06d}",))
                    every = medians(conn, EVERY)
                    recent = statistics.median(creating[-min(len(creating), 50) :]) * 1000
                    print(f"{layout:<8}{index:>6}{recent:>14.1f}{named[0]:>18.2f}{named[1]:>11.2f}{every[0]:>22.2f}"
                          f"{every[1]:>11.2f}", flush=True)  # fmt: skip
    finally:
        drop_database(settings, fresh)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    settings = bench_settings()
    with db.connect(settings.database_url, autocommit=True) as conn:
        version = conn.execute("show server_version").fetchone()[0]
    print(f"PostgreSQL {version}; up to {args.runs:,} runs of one trajectory each", flush=True)
    print(f"{'layout':<8}{'runs':>6}{'new run (ms)':>14}{'named: plan (ms)':>18}{'exec (ms)':>11}"
          f"{'every run: plan (ms)':>22}{'exec (ms)':>11}")  # fmt: skip
    for layout in ("shared", "by run"):
        measure(settings, layout, args.runs)


if __name__ == "__main__":
    main()
