"""Commands over the ledger: sink (writes it), runs, sql and show (read it)."""

from __future__ import annotations

import csv
import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from streamrl.cli.common import (
    CommandFailed,
    UsageError,
    checked_run_id,
    cli_command,
    console,
    database_url,
    err_console,
    parse_shard,
    plain,
    print_table,
    readonly_url,
    settings,
    visible,
)


def register(app: typer.Typer) -> None:
    for command in (sink, runs, sql, show, archive, restore):
        app.command()(cli_command(command))


def sink(
    run: Annotated[str | None, typer.Option(help="Only this run's topics (default: every run).")] = None,
    max_batch: Annotated[int, typer.Option(help="Most records written per database transaction.")] = 2000,
    idle_exit: Annotated[float | None, typer.Option(help="Exit after this many seconds without messages.")] = None,
    shard: Annotated[
        str, typer.Option(help="I/N: this sink writes the partitions with crc32(topic:partition) % N == I.")
    ] = "0/1",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each batch.")] = False,
) -> None:
    """Write every event of every run (or of --run) into the ledger, idempotently;
    undecodable messages go to the run's dead-letter topic and table. SIGTERM/SIGINT
    finish the current batch, commit and exit 0."""
    from streamrl.consumers.ledger_sink import LedgerSink
    from streamrl.runtime.runs import stop_on_signals

    stop = stop_on_signals()  # first: a SIGTERM during start-up still ends in a clean exit
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    current = settings()
    if run:
        checked_run_id(run, "--run")
    index_count = parse_shard(shard)
    database_url(current)
    worker = LedgerSink(current, run_id=run, max_batch=max_batch, shard=index_count, stop=stop)
    started = time.monotonic()
    # said once its signal handlers are in place: from here SIGTERM ends it cleanly
    console.print(f"sink running: {'run ' + run if run else 'every run'} into the ledger (SIGTERM or Ctrl-C stops it)")

    def report(stats):
        if verbose:
            rate = stats.rows / max(time.monotonic() - started, 1e-9)
            err_console.print(f"rows {stats.rows}  dead letters {stats.dead_letters}  {rate:,.0f} rows/s")

    try:
        stats = worker.run(idle_exit_s=idle_exit, on_batch=report)
    finally:
        worker.close()
    console.print(f"sink stopped: {stats.rows} rows, {stats.dead_letters} dead letters, {stats.batches} batches")


RUNS_QUERY = """
    select r.run_id, r.name, r.status, r.parent_run_id as parent, r.created_at,
           (select e.details->>'tag' from run_events e where e.run_id = r.run_id and e.kind = 'created'
            limit 1) as tag,
           (select count(*) from tasks t where t.run_id = r.run_id) as tasks,
           (select count(*) from trajectories t where t.run_id = r.run_id) as trajectories,
           (select count(*) from train_steps t where t.run_id = r.run_id) as steps,
           (select count(*) from dead_letters t where t.run_id = r.run_id) as dead_letters
    from runs r
    where %(tag)s::text is null or exists (select 1 from run_events e where e.run_id = r.run_id
                                           and e.kind = 'created' and e.details->>'tag' = %(tag)s)
    order by r.created_at desc limit %(limit)s"""


def runs(
    limit: Annotated[int, typer.Option(help="Show at most this many runs, newest first.")] = 50,
    tag: Annotated[
        str | None, typer.Option("--tag", "-t", help="Only the runs started with this tag (`streamrl run -t TAG`).")
    ] = None,
) -> None:
    """List the runs in the ledger with their status, tag and event counts."""
    from streamrl.runtime.sql import SqlFailed, run_readonly

    try:
        result = run_readonly(readonly_url(), RUNS_QUERY, {"limit": limit, "tag": tag})
    except SqlFailed as exc:
        raise CommandFailed(f"{exc} (has `streamrl db upgrade` run?)") from None
    print_table(result.columns, result.rows)


def parse_params(params: list[str]) -> dict:
    parsed = {}
    for item in params:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"--param {item!r}: expected NAME=VALUE")
        parsed[name] = value
    return parsed


def sql(
    query: Annotated[str | None, typer.Argument(help="One read-only SQL statement.")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", exists=True, dir_okay=False, help="Read the statement from this file.")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", metavar="NAME=VALUE", help="Bound parameter NAME=VALUE, used as %(NAME)s."),
    ] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="Write CSV to stdout.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Write a JSON array of objects to stdout.")] = False,
    parquet: Annotated[
        Path | None, typer.Option("--parquet", dir_okay=False, help="Write the result to this Parquet file.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Statement timeout in seconds.")] = 30.0,
    max_rows: Annotated[
        int, typer.Option(help="Rows shown at most (the table, --json, --parquet); --csv streams them all.", min=1)
    ] = 10_000,
    max_bytes: Annotated[
        int, typer.Option(help="Bytes of rows held at most, roughly (the table, --json, --parquet).", min=1)
    ] = 64 * 2**20,
) -> None:
    """Run one read-only SQL statement against the ledger (a read-only transaction with a
    statement timeout; writes and multiple statements are refused). Rows come from a
    server-side cursor: --csv streams every row; the other forms stop at --max-rows or
    --max-bytes and say so."""
    from streamrl.runtime.sql import readonly_rows, run_readonly

    if (query is None) == (file is None):
        raise UsageError("give a QUERY or --file, not both or neither")
    if sum([as_csv, as_json, parquet is not None]) > 1:
        raise UsageError("choose one of --csv, --json and --parquet")
    params = parse_params(param or [])
    text = file.read_text() if file else query or ""  # one of them (checked above)
    if as_csv:
        with readonly_rows(readonly_url(), text, params, timeout) as (columns, rows):
            writer = csv.writer(sys.stdout)
            shown = visible if sys.stdout.isatty() else (lambda text: text)  # a file gets the data as it is
            writer.writerow([shown(str(c)) for c in columns])
            for row in rows:
                values = [plain(v) for v in row]
                writer.writerow([shown(v) if isinstance(v, str) else v for v in values])
        return
    result = run_readonly(readonly_url(), text, params, timeout, max_rows=max_rows, max_bytes=max_bytes)
    if result.stopped:
        err_console.print(
            f"stopped at {result.stopped} (--max-rows, --max-bytes); --csv streams every row", highlight=False, markup=False
        )
    if parquet is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = {c: [plain(row[i]) for row in result.rows] for i, c in enumerate(result.columns)}
        columns = {
            c: (
                [None if v is None else json.dumps(v) for v in values]
                if any(isinstance(v, (dict, list)) for v in values)
                else values
            )
            for c, values in columns.items()
        }  # JSON columns travel as JSON text
        pq.write_table(pa.table(columns), parquet)
        err_console.print(f"{len(result.rows)} rows -> {parquet}", highlight=False)
    elif as_json:
        records = [{c: plain(v) for c, v in zip(result.columns, row)} for row in result.rows]
        sys.stdout.write(json.dumps(records, default=str) + "\n")
    else:
        print_table(result.columns, result.rows)


def show(
    run: Annotated[str, typer.Argument(help="Run id.")],
    out: Annotated[
        Path | None, typer.Option(help="Folder for report.html and reward_curve.png (default: STREAMRL_HOME/runs/RUN).")
    ] = None,
) -> None:
    """A run's story from the ledger: its config, steps and validation, throughput,
    staleness, filtered groups and dead letters; in the terminal, and as an HTML report
    with the reward-curve PNG."""
    from streamrl.report import run_config, write_story

    current = settings()
    url = readonly_url(current)
    config, parent = run_config(url, run)
    if not config:
        raise UsageError(f"run {run!r} is not in the ledger (streamrl runs lists the runs)")
    html, pngs, text = write_story(url, run, config, parent, out or current.home / "runs" / run, console.width)
    console.print(text, end="")
    console.print(f"report: {html}  plots: {'  '.join(str(p) for p in pngs)}", highlight=False)
    from streamrl.archive import archive_state
    from streamrl.runtime.db import connect

    with connect(url) as conn:
        archived = archive_state(conn, run)
    if archived is not None:
        console.print(
            f"its rollouts are archived in {visible(archived['folder'])} ({archived['tables']['trajectories']:,} "
            f"trajectories): the counts above are what the ledger still holds; `streamrl restore {run}` puts them back",
            highlight=False,
            markup=False,
        )


ARCHIVE_ROOT_HELP = "The archive's folder (default: STREAMRL_HOME/archive); the run's files go in FOLDER/RUN."


def archive(
    run: Annotated[str, typer.Argument(help="Run id (a finished or failed run).")],
    to: Annotated[Path | None, typer.Option("--to", help=ARCHIVE_ROOT_HELP)] = None,
) -> None:
    """Move a run's rollouts (tasks, trajectories, evaluations, samples, filtered groups)
    out of the ledger into Parquet files, checked before anything is deleted; its steps,
    weight versions and events stay, so `show` still draws its curves."""
    from streamrl.archive import ArchiveError, archive_run, run_folder

    current = settings()
    root = to or current.home / "archive"
    _refuse_running(current, run)
    try:
        counts = archive_run(database_url(current), run, root)
    except ArchiveError as exc:
        raise CommandFailed(str(exc)) from None
    console.print(f"archived {run} to {run_folder(root, run)}: {_counted(counts)}", highlight=False)


def restore(
    run: Annotated[str, typer.Argument(help="Run id.")],
    source: Annotated[Path | None, typer.Option("--from", help=ARCHIVE_ROOT_HELP)] = None,
) -> None:
    """Copy an archived run's rollouts back into the ledger (ids included)."""
    from streamrl.archive import ArchiveError, restore_run

    current = settings()
    try:
        counts = restore_run(database_url(current), run, source or current.home / "archive")
    except ArchiveError as exc:
        raise CommandFailed(str(exc)) from None
    console.print(f"restored {run}: {_counted(counts)}", highlight=False)


def _refuse_running(current, run: str) -> None:
    from streamrl.runtime.db import connect

    with connect(database_url(current)) as conn:
        row = conn.execute("select status from runs where run_id = %s", (run,)).fetchone()
    if row is None:
        raise UsageError(f"run {run!r} is not in the ledger (streamrl runs lists the runs)")
    if row[0] in ("created", "running"):
        raise UsageError(f"run {run!r} is {row[0]}: archive a finished or failed run")


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{rows:,} {table}" for table, rows in counts.items())
