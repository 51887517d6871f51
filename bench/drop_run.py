"""What removing one run's rollouts from the ledger costs: the rollout tables as one
shared table each (migration 0018, where `streamrl archive` deleted the run's rows)
against partitioned by run (0019, where it drops the run's own tables).

Two runs of the same size are written by the sink's own code (rollouts as
bench/ledger_bytes.py makes them: prompts of 512-4,096 tokens, long-tailed responses of
mean ~2,000); then one is removed as each layout's archive removes it, and the other
stays. Printed for each layout: the seconds the removal held its transaction, the
ledger's rollout tables' bytes on disk before, right after, and after a plain VACUUM
(what autovacuum would do; only VACUUM FULL, which locks the tables, gives a shared
table's space back to the disk), and the VACUUM's seconds.

    python bench/drop_run.py [--rollouts 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from alembic import command
from common import bench_settings, drop_database, fresh_database
from ledger_bytes import rollout, stored_bytes_sql

from streamrl.archive import ARCHIVED_TABLES, delete_archived
from streamrl.consumers.ledger_writes import Placed, create_staging_tables, insert_events
from streamrl.runtime import db

RUNS = ("removed", "kept")


def write_runs(conn, rollouts: int) -> None:
    create_staging_tables(conn)
    rng, offset = np.random.default_rng(0), 0
    for run_id in RUNS:
        for start in range(0, rollouts, 100):
            placed = []
            for index in range(start, min(rollouts, start + 100)):
                for event in rollout(run_id, index, rng):
                    placed.append(Placed(event, "bench", 0, offset))
                    offset += 1
            with conn.transaction():
                insert_events(conn, placed)


def ledger_bytes(conn) -> int:
    return sum(int(conn.execute(stored_bytes_sql(), {"table": t.name}).fetchone()[0]) for t in ARCHIVED_TABLES)


def removed_counts(conn) -> dict[str, int]:
    return {
        t.name: conn.execute(f"select count(*) from {t.name} where run_id = %s", (RUNS[0],)).fetchone()[0]
        for t in ARCHIVED_TABLES
    }


def remove_shared(conn, counts: dict[str, int]) -> None:
    """Migration 0018's layout: what `streamrl archive` did there."""
    with conn.transaction():
        for table in ARCHIVED_TABLES:
            deleted = conn.execute(f"delete from {table.name} where run_id = %s", (RUNS[0],)).rowcount
            assert deleted == counts[table.name]


def remove_partitioned(conn, counts: dict[str, int]) -> None:
    """Migration 0019's layout: what `streamrl archive` does now (its checks included)."""
    delete_archived(conn, RUNS[0], Path("bench-archive"), counts)


def measure(settings, layout: str, rollouts: int) -> dict[str, float]:
    fresh = fresh_database(settings, f"streamrl_drop_run_{layout}")
    try:
        if layout == "shared":  # the layout before migration 0019
            command.downgrade(db.alembic_config(fresh.database_url), "0018")
        with db.connect(fresh.database_url, autocommit=True) as conn:
            write_runs(conn, rollouts)
            conn.execute("vacuum analyze")
            before = ledger_bytes(conn)
            counts = removed_counts(conn)
            started = time.perf_counter()
            (remove_shared if layout == "shared" else remove_partitioned)(conn, counts)
            removal = time.perf_counter() - started
            after = ledger_bytes(conn)
            started = time.perf_counter()
            conn.execute("vacuum")
            vacuum = time.perf_counter() - started
            return {"removal": removal, "before": before, "after": after, "vacuumed": ledger_bytes(conn), "vacuum": vacuum}
    finally:
        drop_database(settings, fresh)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=1000, help="rollouts in each of the two runs")
    args = parser.parse_args()
    settings = bench_settings()
    with db.connect(settings.database_url, autocommit=True) as conn:
        version = conn.execute("show server_version").fetchone()[0]
    print(f"PostgreSQL {version}; two runs of {args.rollouts:,} rollouts each; one removed", flush=True)
    print(f"{'layout':<34}{'removal (s)':>12}{'MB before':>11}{'MB after':>10}{'MB after VACUUM':>17}{'VACUUM (s)':>12}")
    names = {"shared": "one table (0018): DELETE", "partitioned": "by run (0019): DROP TABLE"}
    for layout in ("shared", "partitioned"):
        m = measure(settings, layout, args.rollouts)
        print(
            f"{names[layout]:<34}{m['removal']:>12.3f}{m['before'] / 1e6:>11.1f}{m['after'] / 1e6:>10.1f}"
            f"{m['vacuumed'] / 1e6:>17.1f}{m['vacuum']:>12.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
