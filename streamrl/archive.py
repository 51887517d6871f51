"""`streamrl archive RUN` and `streamrl restore RUN`: a run's rollouts out of the ledger's
tables into Parquet files, and back.

A run's rollout-level rows (tasks, trajectories, evaluations, samples, filtered groups)
are nearly all of a ledger's bytes; its steps, weight versions and events are small and
stay, so `streamrl show` still draws its curves. Archiving writes one Parquet file per
table (zstd, in row groups as the rows are read from a server-side cursor), reads every
file back and checks its row count against the table before it deletes anything, then
drops the run's own tables (the rollout tables are partitioned by run) and records an
`archived` run event naming the folder, in one transaction. Restoring creates the run's
tables again, copies the rows back, ids included, and records `restored`.

The files are plain Parquet: a table's columns with PostgreSQL's types as Arrow's (JSON
columns as JSON text, packed token arrays as binary), readable by DuckDB, pandas or
pyarrow (docs/operations.md shows the schema).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from psycopg.types.json import Jsonb
from sqlalchemy import ARRAY, BigInteger, Boolean, DateTime, Float, Integer, LargeBinary, Table, Text
from sqlalchemy.dialects.postgresql import JSONB

from streamrl.runtime.db import connect
from streamrl.schema.ledger import evaluations, filtered_groups, samples, tasks, trajectories

ARCHIVED_TABLES: tuple[Table, ...] = (tasks, trajectories, evaluations, samples, filtered_groups)
ROWS_PER_BATCH = 500


class ArchiveError(RuntimeError):
    """The archive cannot be written, read back or restored: nothing was deleted or added."""


def arrow_type(column) -> pa.DataType:
    kind = column.type
    if isinstance(kind, ARRAY):
        return pa.list_(pa.float64() if isinstance(kind.item_type, Float) else pa.string())
    for sql_type, arrow in (
        (BigInteger, pa.int64()),
        (Integer, pa.int32()),
        (Float, pa.float64()),
        (Boolean, pa.bool_()),
        (LargeBinary, pa.large_binary()),
        (JSONB, pa.large_string()),
        (DateTime, pa.timestamp("us", tz="UTC")),
        (Text, pa.large_string()),
    ):
        if isinstance(kind, sql_type):
            return arrow
    raise TypeError(f"{column.table.name}.{column.name}: no Arrow type for {kind!r}")


def arrow_schema(table: Table) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c), nullable=c.nullable) for c in table.columns])


def run_folder(root: Path, run_id: str) -> Path:
    return root / run_id


def archive_run(database_url: str, run_id: str, root: Path) -> dict[str, int]:
    """Write the run's rollout rows to `root/RUN/*.parquet`, check them, delete them from
    the ledger and record the archive; the rows per table."""
    folder = run_folder(root, run_id)
    if (folder / "manifest.json").exists():
        raise ArchiveError(f"{folder} already holds an archive of {run_id}; restore it or move it first")
    folder.mkdir(parents=True, exist_ok=True)
    with connect(database_url) as conn:
        if conn.execute("select 1 from runs where run_id = %s", (run_id,)).fetchone() is None:
            raise ArchiveError(f"run {run_id!r} is not in the ledger (streamrl runs lists the runs)")
        counts = {table.name: write_table(conn, table, run_id, folder / f"{table.name}.parquet") for table in ARCHIVED_TABLES}
        for table in ARCHIVED_TABLES:  # every file whole before a row goes
            readable = pq.ParquetFile(folder / f"{table.name}.parquet").metadata.num_rows
            if readable != counts[table.name]:
                raise ArchiveError(
                    f"{table.name}.parquet holds {readable} rows, the ledger {counts[table.name]}: nothing deleted"
                )
        manifest = {"run_id": run_id, "tables": counts, "archived_at": datetime.now(UTC).isoformat(), "format": 1}
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            delete_archived(conn, run_id, folder, counts)
        except BaseException:
            (folder / "manifest.json").unlink()  # the rows stayed: the files are not an archive
            raise
    return counts


def delete_archived(conn, run_id: str, folder: Path, counts: dict[str, int]) -> None:
    """The run's rollout tables dropped (migration 0019 gave each run its own) and the
    `archived` event in, in one transaction: dropping is immediate and leaves no dead rows
    for a vacuum, where a DELETE took time in proportion to the rows."""
    with conn.transaction():
        tables = {table.name: run_table(conn, table.name, run_id) for table in ARCHIVED_TABLES}
        for name, own in tables.items():
            if own is None:
                held = 0
            else:
                conn.execute(f'lock table "{own}" in access exclusive mode')  # no row may arrive between count and drop
                held = conn.execute(f'select count(*) from "{own}"').fetchone()[0]
            if held != counts[name]:  # rows written meanwhile (a live run): keep everything
                raise ArchiveError(
                    f"{name}: {held} rows to delete, {counts[name]} archived: the run is still writing; archive a finished run"
                )
        for own in tables.values():
            if own is not None:
                conn.execute(f'drop table "{own}"')
        record(conn, run_id, "archived", {"folder": str(folder.absolute()), "tables": counts})


def run_table(conn, parent: str, run_id: str) -> str | None:
    """The name of the table holding the run's rows of `parent`, if it has one now."""
    row = conn.execute(
        "select c.relname from pg_class c where c.oid = to_regclass(quote_ident(streamrl_partition_name(%s, %s)))",
        (parent, run_id),
    ).fetchone()
    return row[0] if row else None


def write_table(conn, table: Table, run_id: str, path: Path) -> int:
    schema = arrow_schema(table)
    names = [c.name for c in table.columns]
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSONB)}
    rows_written = 0
    with conn.transaction(), pq.ParquetWriter(path, schema, compression="zstd") as writer:
        cursor = conn.cursor(name=f"archive_{table.name}")
        cursor.execute(f"select {', '.join(names)} from {table.name} where run_id = %s order by id", (run_id,))
        while rows := cursor.fetchmany(ROWS_PER_BATCH):
            columns = [
                [json.dumps(row[i]) if name in json_columns and row[i] is not None else row[i] for row in rows]
                for i, name in enumerate(names)
            ]
            writer.write_batch(pa.record_batch(columns, schema=schema))
            rows_written += len(rows)
        cursor.close()
    return rows_written


def restore_run(database_url: str, run_id: str, root: Path) -> dict[str, int]:
    """Copy an archived run's rows back into the ledger (ids included); the rows per table."""
    folder = run_folder(root, run_id)
    manifest_path = folder / "manifest.json"
    if not manifest_path.exists():
        raise ArchiveError(f"no archive of {run_id} in {folder} (its manifest.json is missing)")
    expected = json.loads(manifest_path.read_text())["tables"]
    counts = {}
    with connect(database_url) as conn, conn.transaction():
        conn.execute("select streamrl_run_partitions(%s)", (run_id,))  # the archive dropped the run's tables
        for table in ARCHIVED_TABLES:
            if conn.execute(f"select 1 from {table.name} where run_id = %s limit 1", (run_id,)).fetchone():
                raise ArchiveError(f"{table.name} already holds rows of {run_id}: restoring would duplicate them")
            counts[table.name] = copy_back(conn, table, folder / f"{table.name}.parquet")
            if counts[table.name] != expected.get(table.name):
                raise ArchiveError(
                    f"{table.name}.parquet gave {counts[table.name]} rows, the manifest says {expected.get(table.name)}"
                )
        record(conn, run_id, "restored", {"folder": str(folder.absolute()), "tables": counts})
    return counts


def copy_back(conn, table: Table, path: Path) -> int:
    names = [c.name for c in table.columns]
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSONB)}
    restored = 0
    with conn.cursor().copy(f"copy {table.name} ({', '.join(names)}) from stdin") as copy:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=ROWS_PER_BATCH):
            for row in batch.to_pylist():
                copy.write_row([Jsonb(json.loads(row[n])) if n in json_columns and row[n] is not None else row[n] for n in names])
                restored += 1
    return restored


def record(conn, run_id: str, kind: str, details: dict) -> None:
    """An `archived` / `restored` run event (what `show` and `replay` consult)."""
    sequence = conn.execute("select coalesce(max(sequence), 0) + 1 from run_events where run_id = %s", (run_id,)).fetchone()[0]
    conn.execute(
        "insert into run_events (event_id, run_id, schema_version, created_at, kind, sequence, name, details) "
        "values (%s, %s, 1, now(), %s, %s, 'archive', %s)",
        (f"{run_id}:{kind}:{sequence}", run_id, kind, sequence, Jsonb(details)),
    )


def archive_state(conn, run_id: str) -> dict | None:
    """The run's last archive event's details, when it is archived now (None otherwise)."""
    row = conn.execute(
        "select kind, details from run_events where run_id = %s and kind in ('archived', 'restored') "
        "order by sequence desc limit 1",
        (run_id,),
    ).fetchone()
    return row[1] if row and row[0] == "archived" else None
