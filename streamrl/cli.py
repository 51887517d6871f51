"""The `streamrl` command line. One function per command; the docstring is the help.

Exit codes: 0 success; 1 the command ran and failed (a refused or failing query, an
unhealthy service); 2 bad usage or input (typer's own code); 3 a service is missing or
unreachable.
"""

from __future__ import annotations

import csv
import json
import logging
import sys
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from streamrl import services
from streamrl.settings import Settings, SettingsError

app = typer.Typer(help="StreamRL: event-sourced RL post-training for LLMs.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
db_app = typer.Typer(help="Ledger database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")
recipe_app = typer.Typer(help="Recipes: YAML with defaults: composition and ${oc.env:VAR,default}.",
                         no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")

console = Console()
err_console = Console(stderr=True)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SERVICE = 3


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_USAGE)


def _database_url(settings: Settings) -> str:
    try:
        return settings.database_url
    except SettingsError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_SERVICE)


def _check_database(url: str) -> None:
    ok, detail = services.postgres_probe(url)
    if not ok:
        err_console.print(f"[red]error:[/] cannot reach PostgreSQL at {services.redact(url)}: {detail}")
        raise typer.Exit(EXIT_SERVICE)


@app.command()
def up(migrate: bool = typer.Option(True, help="Run the ledger migrations after starting.")) -> None:
    """Start the embedded broker and PostgreSQL (unless external ones are configured) and
    migrate the ledger. Safe to run again: it starts only what is not running."""
    settings = _settings()
    try:
        for line in services.up(settings):
            console.print(line)
    except services.ServiceError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_SERVICE)
    if migrate:
        from streamrl import db

        url = _database_url(settings)
        _check_database(url)
        db.upgrade(url)
        console.print(f"ledger: migrated to revision {db.current_revision(url)}")


@app.command()
def down() -> None:
    """Stop the services that `streamrl up` started here (never external ones)."""
    settings = _settings()
    for line in services.down(settings):
        console.print(line)


@app.command()
def status() -> None:
    """Show each service: embedded or external, address, version and health."""
    settings = _settings()
    table = Table("service", "mode", "address", "version", "health")
    statuses = services.status(settings)
    for s in statuses:
        health = "[green]healthy[/]" if s.healthy else f"[red]down[/] {s.detail}"
        table.add_row(s.name, s.mode, s.address, s.version, health)
    console.print(table)
    if any(s.mode == "not configured" for s in statuses):
        raise typer.Exit(EXIT_SERVICE)
    if not all(s.healthy for s in statuses):
        raise typer.Exit(EXIT_FAILED)


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target Alembic revision.")) -> None:
    """Apply the ledger's Alembic migrations up to REVISION (default: the latest)."""
    from streamrl import db

    url = _database_url(_settings())
    _check_database(url)
    db.upgrade(url, revision)
    console.print(f"ledger at revision {db.current_revision(url)}")


@recipe_app.command("new")
def recipe_new(
    name: str = typer.Argument(..., help="The recipe's name (letters, digits, underscores)."),
    directory: Path = typer.Option(Path("recipes"), "--dir", help="Where to create the recipe's folder."),
) -> None:
    """Scaffold a recipe folder: common.yaml, NAME.yaml, NAME.env.sh, setup.py and an
    agent_workspace/ (agent config, tools, evaluator, a custom worker), ready to run."""
    from streamrl.scaffold import scaffold_recipe

    try:
        folder = scaffold_recipe(name, directory)
    except (ValueError, FileExistsError) as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        console.print(f"  {path}", highlight=False)
    console.print(f"run it: streamrl run {folder / (name + '.yaml')}", highlight=False)


@recipe_app.command("validate")
def recipe_validate(
    file: Path = typer.Argument(..., help="The recipe YAML."),
    show: bool = typer.Option(False, "--show", help="Print the fully resolved recipe."),
) -> None:
    """Check a recipe: unknown keys, wrong types and missing files, each with its key path
    (exit 2 if any)."""
    import yaml

    from streamrl.recipe import RecipeError, load_recipe

    try:
        values = load_recipe(file)
    except RecipeError as exc:
        err_console.print(f"[red]invalid recipe[/] {exc.path}:", highlight=False, soft_wrap=True)
        for problem in exc.problems:
            err_console.print(f"  - {problem}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)
    if show:
        console.print(yaml.safe_dump(values, sort_keys=False), highlight=False, markup=False)
    console.print(f"{file}: valid ({values['project_name']}/{values['experiment_name']}, "
                  f"trainer {values['trainer']['type']}, {values['algorithm']['type']} advantages, "
                  f"{values['weight']['sync_mode']} weight sync)", highlight=False)


@app.command()
def runs(limit: int = typer.Option(50, help="Show at most this many runs, newest first.")) -> None:
    """List the runs in the ledger with their status and event counts."""
    from streamrl.sql import SqlFailed, run_readonly

    url = _database_url(_settings())
    _check_database(url)
    query = """
        select r.run_id, r.name, r.status, r.parent_run_id as parent, r.created_at,
               (select count(*) from tasks t where t.run_id = r.run_id) as tasks,
               (select count(*) from trajectories t where t.run_id = r.run_id) as trajectories,
               (select count(*) from train_steps t where t.run_id = r.run_id) as steps,
               (select count(*) from dead_letters t where t.run_id = r.run_id) as dead_letters
        from runs r order by r.created_at desc limit %(limit)s"""
    try:
        result = run_readonly(url, query, {"limit": limit})
    except SqlFailed as exc:
        err_console.print(f"[red]error:[/] {exc} (has `streamrl db upgrade` run?)")
        raise typer.Exit(EXIT_FAILED)
    _print_table(result.columns, result.rows)


def _plain(value):
    if isinstance(value, (bytes, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _print_table(columns: list[str], rows: list[tuple]) -> None:
    table = Table(*columns)
    for row in rows:
        table.add_row(*(
            "" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else str(_plain(v)))
            for v in row))
    console.print(table)
    console.print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", style="dim")


def _parse_params(params: list[str]) -> dict:
    parsed = {}
    for item in params:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            err_console.print(f"[red]error:[/] --param {item!r}: expected NAME=VALUE")
            raise typer.Exit(EXIT_USAGE)
        parsed[name] = value
    return parsed


@app.command()
def sql(
    query: Optional[str] = typer.Argument(None, help="One read-only SQL statement."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", exists=True, dir_okay=False,
                                        help="Read the statement from this file."),
    param: list[str] = typer.Option([], "--param", "-p", help="Bound parameter NAME=VALUE, used as %(NAME)s."),
    as_csv: bool = typer.Option(False, "--csv", help="Write CSV to stdout."),
    as_json: bool = typer.Option(False, "--json", help="Write a JSON array of objects to stdout."),
    parquet: Optional[Path] = typer.Option(None, "--parquet", dir_okay=False, help="Write the result to this Parquet file."),
    timeout: float = typer.Option(30.0, help="Statement timeout in seconds."),
) -> None:
    """Run one read-only SQL statement against the ledger (a read-only transaction with a
    statement timeout; writes and multiple statements are refused)."""
    from streamrl.sql import SqlFailed, SqlRefused, run_readonly

    if (query is None) == (file is None):
        err_console.print("[red]error:[/] give a QUERY or --file, not both or neither")
        raise typer.Exit(EXIT_USAGE)
    if sum([as_csv, as_json, parquet is not None]) > 1:
        err_console.print("[red]error:[/] choose one of --csv, --json and --parquet")
        raise typer.Exit(EXIT_USAGE)
    text = file.read_text() if file else query
    url = _database_url(_settings())
    _check_database(url)
    try:
        result = run_readonly(url, text, _parse_params(param), timeout)
    except SqlRefused as exc:
        err_console.print(f"[red]refused:[/] {exc}")
        raise typer.Exit(EXIT_FAILED)
    except SqlFailed as exc:
        err_console.print(f"[red]query failed:[/] {exc}")
        raise typer.Exit(EXIT_FAILED)
    if parquet is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = {c: [_plain(row[i]) for row in result.rows] for i, c in enumerate(result.columns)}
        columns = {c: ([None if v is None else json.dumps(v) for v in values]
                       if any(isinstance(v, (dict, list)) for v in values) else values)
                   for c, values in columns.items()}  # JSON columns travel as JSON text
        pq.write_table(pa.table(columns), parquet)
        err_console.print(f"{len(result.rows)} rows -> {parquet}", highlight=False)
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(result.columns)
        writer.writerows([[_plain(v) for v in row] for row in result.rows])
    elif as_json:
        records = [{c: _plain(v) for c, v in zip(result.columns, row)} for row in result.rows]
        sys.stdout.write(json.dumps(records, default=str) + "\n")
    else:
        _print_table(result.columns, result.rows)


def _parse_shard(shard: str) -> tuple[int, int]:
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        err_console.print(f"[red]error:[/] --shard {shard!r}: expected I/N with 0 <= I < N, e.g. 0/2")
        raise typer.Exit(EXIT_USAGE)
    return int(index), int(count)


@app.command()
def sink(
    run: Optional[str] = typer.Option(None, help="Only this run's topics (default: every run)."),
    max_batch: int = typer.Option(2000, help="Most records written per database transaction."),
    idle_exit: Optional[float] = typer.Option(None, help="Exit after this many seconds without messages."),
    shard: str = typer.Option("0/1", help="I/N: this sink writes the partitions with crc32(topic:partition) % N == I."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each batch."),
) -> None:
    """Write every event of every run (or of --run) into the ledger, idempotently;
    undecodable messages go to the run's dead-letter topic and table. SIGTERM/SIGINT
    finish the current batch, commit and exit 0."""
    from consumers.ledger_sink import LedgerSink
    from schema.topics import validate_run_id

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = _settings()
    if run:
        try:
            validate_run_id(run)
        except ValueError as exc:
            err_console.print(f"[red]error:[/] --run: {exc}")
            raise typer.Exit(EXIT_USAGE)
    index_count = _parse_shard(shard)
    _check_database(_database_url(settings))
    worker = LedgerSink(settings, run_id=run, max_batch=max_batch, shard=index_count)
    worker.install_signal_handlers()
    started = time.monotonic()

    def report(stats):
        if verbose:
            rate = stats.rows / max(time.monotonic() - started, 1e-9)
            err_console.print(f"rows {stats.rows}  dead letters {stats.dead_letters}  {rate:,.0f} rows/s")

    try:
        stats = worker.run(idle_exit_s=idle_exit, on_batch=report)
    finally:
        worker.close()
    console.print(f"sink stopped: {stats.rows} rows, {stats.dead_letters} dead letters, {stats.batches} batches")


@app.command()
def topics(
    run: str = typer.Argument(..., help="Run id."),
    partitions: Optional[int] = typer.Option(None, help="Partitions per topic (default STREAMRL_TOPIC_PARTITIONS)."),
) -> None:
    """Create RUN's topics (tasks, trajectories, ..., dead_letters) if they do not exist."""
    from schema.topics import TopicNameError, run_topics
    from streamrl.bus import create_run_topics

    settings = _settings()
    try:
        names = run_topics(run)
    except TopicNameError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_USAGE)
    created = create_run_topics(settings, run, partitions)
    for name in names.values():
        console.print(f"{name}  {'created' if name in created else 'exists'}")


def recipe_code_problems(recipe: dict) -> list[str]:
    """Load the recipe's own code now (evaluator, worker, trainer, advantage estimator),
    so a typo fails the run before it starts, not in a worker's log minutes later."""
    from consumers.advantages import get_advantage_estimator
    from consumers.processor import load_custom_advantages
    from learner.loop import trainer_class
    from producers.agent_worker import AgentRolloutWorker, load_agent_setup
    from producers.worker_loop import make_evaluator, worker_class

    def agent_setup():
        if issubclass(worker_class(recipe), AgentRolloutWorker):
            load_agent_setup(recipe["rollout_worker"])

    problems = []
    checks = [("rollout_worker.evaluator_module_path", lambda: make_evaluator(recipe)),
              ("rollout_worker.custom_rollout_worker_module_path", lambda: worker_class(recipe)),
              ("rollout_worker.agent_config_path", agent_setup),
              ("trainer.custom_trainer_module_path", lambda: trainer_class(recipe)),
              ("algorithm.custom_advantage_module_path",
               lambda: load_custom_advantages(recipe["algorithm"]["custom_advantage_module_path"])),
              ("algorithm.type", lambda: get_advantage_estimator(recipe["algorithm"]["type"]))]
    for key, check in checks:
        try:
            check()
        except (ValueError, KeyError) as exc:  # LoadError is a ValueError
            problems.append(f"{key}: {exc.args[0] if exc.args else exc}")
    return problems


def _prepared_recipe(file: Path) -> dict:
    from streamrl.recipe import RecipeError, prepare_recipe

    try:
        recipe = prepare_recipe(file)
        problems = recipe_code_problems(recipe)
        if problems:
            raise RecipeError(file, problems)
        return recipe
    except RecipeError as exc:
        err_console.print(f"[red]invalid recipe[/] {exc.path}:", highlight=False, soft_wrap=True)
        for problem in exc.problems:
            err_console.print(f"  - {problem}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)


def _run_config(settings: Settings, run: str) -> dict:
    from streamrl.runs import RunNotFound, fetch_run_config

    try:
        return fetch_run_config(settings, run)
    except (RunNotFound, RuntimeError) as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_FAILED)


def _new_run_id(recipe: dict) -> str:
    import re
    import secrets

    name = re.sub(r"[^A-Za-z0-9_-]+", "-", recipe["experiment_name"]).strip("-") or "run"
    return f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@app.command()
def publish(
    file: Optional[Path] = typer.Argument(None, help="The recipe YAML (not with --resume)."),
    run: Optional[str] = typer.Option(None, help="Run id (default: experiment name + time)."),
    resume: Optional[str] = typer.Option(None, help="Resume publishing RUN: its config from the ledger; tasks "
                                                    "already rolled out and evaluated are not published again."),
) -> None:
    """Create a run from a recipe (its topics, and a `created` event holding the resolved
    config) and publish its tasks, paced by the weight versions the learner publishes."""
    from streamrl.dataset import DatasetError
    from producers.publisher import create_run, run_publisher
    from schema.topics import TopicNameError, validate_run_id
    from streamrl.bus import EventPublisher
    from streamrl.runs import stop_on_signals

    settings = _settings()
    if (file is None) == (resume is None):
        err_console.print("[red]error:[/] give a recipe FILE or --resume RUN, not both or neither")
        raise typer.Exit(EXIT_USAGE)
    skip: set[str] = set()
    if resume:
        from streamrl.recovery import finished_task_ids

        run, recipe = resume, _run_config(settings, resume)
        skip = finished_task_ids(_database_url(settings), run)
        console.print(f"resuming run {run}: {len(skip)} tasks already done", highlight=False)
    else:
        recipe = _prepared_recipe(file)
        run = run or _new_run_id(recipe)
        try:
            validate_run_id(run)
        except (TopicNameError, ValueError) as exc:
            err_console.print(f"[red]error:[/] --run: {exc}")
            raise typer.Exit(EXIT_USAGE)
        with EventPublisher(settings) as publisher:
            create_run(settings, run, recipe, publisher)
        console.print(f"run {run}", highlight=False)
    stop = stop_on_signals()
    try:
        steps = run_publisher(settings, run, recipe, stop, skip_task_ids=skip)
    except DatasetError as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    console.print(f"published the tasks of {steps} steps", highlight=False)


@app.command()
def worker(
    run: str = typer.Argument(..., help="Run id."),
    shard: str = typer.Option("0/1", help="I/N: serve the tasks partitions p with p % N == I."),
    idle_exit: Optional[float] = typer.Option(None, help="Exit after this many seconds without tasks."),
) -> None:
    """Roll out RUN's tasks: trajectories and evaluations out, offsets committed after.
    SIGTERM/SIGINT finish the tasks in flight, commit and exit 0."""
    from producers.worker_loop import run_worker
    from streamrl.runs import stop_on_signals

    settings = _settings()
    index_count = _parse_shard(shard)
    recipe = _run_config(settings, run)
    import torch

    torch.set_num_threads(1)
    done = run_worker(settings, run, recipe, index_count, stop_on_signals(), idle_exit_s=idle_exit)
    console.print(f"worker stopped after {done} tasks", highlight=False)


@app.command()
def processor(
    run: str = typer.Argument(..., help="Run id."),
    shard: str = typer.Option("0/1", help="I/N: process the partitions p with p % N == I."),
    idle_exit: Optional[float] = typer.Option(None, help="Exit after this many idle seconds with no open group."),
) -> None:
    """Join RUN's trajectories with their evaluations, complete groups, compute advantages
    and emit samples (or a GroupFiltered record for a group that gives none)."""
    from consumers.processor import StreamProcessor
    from streamrl.runs import stop_on_signals

    settings = _settings()
    index_count = _parse_shard(shard)
    recipe = _run_config(settings, run)
    stop = stop_on_signals()
    worker = StreamProcessor(settings, run, recipe, index_count)
    try:
        stats = worker.run(stop, idle_exit_s=idle_exit)
    finally:
        worker.close()
    console.print(f"processor stopped: {stats.groups} groups, {stats.samples} samples, filtered {stats.filtered}",
                  highlight=False)


@app.command()
def learner(
    run: str = typer.Argument(..., help="Run id."),
    reset_offsets: bool = typer.Option(False, "--reset-offsets", help="Read the samples topic from its start "
                                       "(the broker lost the topics the checkpoint's offsets refer to)."),
) -> None:
    """Train RUN: batches of samples, optimizer steps, a checkpoint and a weight version
    per step. Restarted, it resumes after its last checkpointed step."""
    from learner.loop import Learner
    from streamrl.runs import stop_on_signals

    settings = _settings()
    recipe = _run_config(settings, run)
    stop = stop_on_signals()
    trainer = Learner(settings, run, recipe)
    if reset_offsets:
        trainer.start_offsets = None  # samples of checkpointed steps are skipped by step number

    def report(record):
        console.print(f"step {record.step:5d}  reward {record.metrics.get('reward_mean', 0):.3f}  "
                      f"loss {record.loss:+.4f}  samples {record.samples}  {record.seconds:.2f}s", highlight=False)

    try:
        steps = trainer.run(stop, on_step=report)
    finally:
        trainer.close()
    console.print(f"learner stopped after step {steps}", highlight=False)


@app.command("run")
def run_recipe(
    file: Optional[Path] = typer.Argument(None, help="The recipe YAML (not with --resume)."),
    resume: Optional[str] = typer.Option(None, help="Finish RUN after a crash or a broker restart: what the "
                                                    "broker lost is rebuilt from the ledger."),
    run: Optional[str] = typer.Option(None, help="Run id (default: experiment name + time)."),
    workers: Optional[int] = typer.Option(None, help="Rollout worker processes (default: rollout_worker.num_workers)."),
    out: Optional[Path] = typer.Option(None, help="Folder for the summary and reward curve (default: STREAMRL_HOME/runs/RUN)."),
) -> None:
    """Train a recipe end to end on this machine: start the services if needed, then the
    ledger sink, stream processor, learner, rollout workers and publisher as processes,
    with progress bars; at the end a summary table and a reward-curve PNG."""
    from streamrl.orchestrate import RunFailed, run_locally

    settings = _settings()
    if (file is None) == (resume is None):
        err_console.print("[red]error:[/] give a recipe FILE or --resume RUN, not both or neither")
        raise typer.Exit(EXIT_USAGE)
    recipe = _prepared_recipe(file) if file else None
    try:
        for line in services.up(settings):
            console.print(line, highlight=False)
    except services.ServiceError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_SERVICE)
    from streamrl import db

    db.upgrade(_database_url(settings))
    reset_offsets = False
    if resume:
        from learner.checkpoint import latest_checkpoint, load_state
        from learner.loop import run_dir
        from streamrl.recovery import rebuild_from_ledger
        from streamrl.report import run_config

        run = resume
        recipe, _ = run_config(_database_url(settings), run)
        if not recipe:
            err_console.print(f"[red]error:[/] --resume: run {run!r} is not in the ledger")
            raise typer.Exit(EXIT_USAGE)
        checkpoint = latest_checkpoint(run_dir(settings, run, recipe["trainer"]["checkpoint_path"]))
        trained = load_state(checkpoint)["step"] if checkpoint else 0
        rebuilt = rebuild_from_ledger(settings, run, trained)
        reset_offsets = rebuilt.topics_recreated
        console.print(f"resuming {run} after step {trained}: " + (
            f"topics re-created; re-published {rebuilt.events} events from the ledger ({rebuilt.groups})"
            if rebuilt.topics_recreated else "the broker still holds the run's topics"), highlight=False)
    run = run or _new_run_id(recipe)
    try:
        run_locally(settings, file, recipe, run, workers or recipe["rollout_worker"]["num_workers"], out, console,
                    resume=bool(resume), reset_offsets=reset_offsets)
    except RunFailed as exc:
        err_console.print(f"[red]run failed:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_FAILED)


@app.command()
def show(
    run: str = typer.Argument(..., help="Run id."),
    out: Optional[Path] = typer.Option(None, help="Folder for report.html and reward_curve.png (default: STREAMRL_HOME/runs/RUN)."),
) -> None:
    """A run's story from the ledger: its config, steps and validation, throughput,
    staleness, filtered groups and dead letters; in the terminal, and as an HTML report
    with the reward-curve PNG."""
    import base64

    from streamrl.orchestrate import summary_table
    from streamrl.report import config_highlights, load_summary, plot_reward_curve, run_config, story_sections

    settings = _settings()
    url = _database_url(settings)
    _check_database(url)
    config, parent = run_config(url, run)
    if not config:
        err_console.print(f"[red]error:[/] run {run!r} is not in the ledger (streamrl runs lists the runs)")
        raise typer.Exit(EXIT_USAGE)
    out = out or settings.home / "runs" / run
    summary = load_summary(url, run)
    recorder = Console(record=True, width=max(console.width, 100))
    table = Table("setting", "value", title=f"run {run}: config")
    for key, value in config_highlights(config, parent):
        table.add_row(key, value)
    recorder.print(table)
    wall = summary.totals.get("first to last step (s)", 0.0)
    recorder.print(summary_table(summary, wall))
    for name, (columns, rows) in story_sections(url, run).items():
        section = Table(*columns, title=name)
        for row in rows:
            cells = [_plain(v) for v in row]
            section.add_row(*("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in cells))
        if not rows:
            section.caption = "none"
        recorder.print(section)
    png = plot_reward_curve(summary, out / "reward_curve.png")
    html = recorder.export_html(inline_styles=True)
    image = base64.b64encode(png.read_bytes()).decode()
    html = html.replace("</body>", f'<img alt="reward curve" src="data:image/png;base64,{image}"></body>')
    (out / "report.html").write_text(html)
    console.print(recorder.export_text(styles=True), end="")
    console.print(f"report: {out / 'report.html'}  reward curve: {png}", highlight=False)


@app.command()
def replay(
    source: str = typer.Argument(..., help="The recorded run to replay."),
    into: str = typer.Option(..., "--into", help="Id of the new run that trains on the replayed rollouts."),
    recipe_file: Optional[Path] = typer.Option(None, "--recipe", help="Train with this recipe (default: the source run's config)."),
    source_kind: str = typer.Option("auto", "--from", help="auto | kafka | ledger: where the payloads are read."),
    steps: Optional[str] = typer.Option(None, help="A:B: only the source's steps A to B (inclusive)."),
    where: Optional[str] = typer.Option(None, help="SQL condition over t (trajectories) and e (evaluations)."),
    rate: Optional[float] = typer.Option(None, help="Re-publish at most N rollouts a second."),
    correction: Optional[str] = typer.Option(None, help="truncated_is | decoupled_ppo (default: the recipe's, else truncated_is)."),
    recompute_advantages: Optional[str] = typer.Option(None, "--recompute-advantages", help="Advantage estimator for the new run (e.g. dr_grpo)."),
    rescore: Optional[str] = typer.Option(None, "--rescore", help="Re-evaluate with this evaluator, file.py:Class."),
    out: Optional[Path] = typer.Option(None, help="Folder for the summary and reward curve."),
) -> None:
    """Retrain off-policy on a recorded run's rollouts: re-publish its trajectories and
    evaluations (behaviour logprobs and weight versions included) into a new run whose
    processor recomputes advantages and whose learner trains with an off-policy
    correction. The new run records its parent run and each source event id."""
    from producers import replay as rp
    from producers.publisher import create_run
    from schema.topics import TopicNameError, validate_run_id
    from streamrl.bus import EventPublisher
    from streamrl.orchestrate import RunFailed, replay_locally
    from streamrl.sql import SqlFailed, SqlRefused

    settings = _settings()
    url = _database_url(settings)
    _check_database(url)
    try:
        validate_run_id(into)
    except (TopicNameError, ValueError) as exc:
        err_console.print(f"[red]error:[/] --into: {exc}")
        raise typer.Exit(EXIT_USAGE)
    from streamrl.db import connect

    with connect(url, autocommit=True) as conn:
        row = conn.execute("select config from run_events where run_id = %s and kind = 'created'", (source,)).fetchone()
        taken = conn.execute("select 1 from run_events where run_id = %s limit 1", (into,)).fetchone()
    if row is None:
        err_console.print(f"[red]error:[/] run {source!r} is not in the ledger (streamrl runs lists the runs)")
        raise typer.Exit(EXIT_USAGE)
    if taken:
        err_console.print(f"[red]error:[/] --into: run {into!r} already exists; choose a new id")
        raise typer.Exit(EXIT_USAGE)
    recipe = _prepared_recipe(recipe_file) if recipe_file else None
    try:
        step_range = rp.parse_steps(steps)
        selected = rp.select_rollouts(url, source, step_range, where)
        base = recipe or row[0]
        plan = rp.plan_steps(selected, base["trajectory_pool"]["batch_size"])
        if plan.steps == 0:
            raise rp.ReplayError(f"the selection holds {len({g for _, g in selected})} groups, fewer than one step's "
                                 f"{base['trajectory_pool']['batch_size']} (trajectory_pool.batch_size)")
        config = rp.replay_config(row[0], recipe, source_run=source, plan=plan, source=source_kind, steps=steps,
                                  where=where, correction=correction, recompute_advantages=recompute_advantages,
                                  rescore=rescore, rate=rate)
        evaluator = rp.make_rescorer(rescore) if rescore else None  # a bad spec fails before any reading
        trajectories, evaluations, origin = rp.load_rollouts(settings, source, plan.order, source_kind)
        rescorer = None
        if evaluator is not None:
            task_ids = sorted({t.task_id for t in trajectories.values()})
            rescorer = (evaluator, rescore, rp.task_data(url, source, task_ids))
    except (SqlRefused, SqlFailed) as exc:
        err_console.print(f"[red]error:[/] --where: {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    except rp.ReplayError as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    config["replay"]["read_from"] = origin
    console.print(f"replaying {len(plan.order)} rollouts in {len(plan.group_size_of)} groups as {plan.steps} steps "
                  f"(kafka: {origin['kafka']}, ledger: {origin['ledger']}; left out: {plan.left_out_groups} groups "
                  f"of a partial step); correction {config['algorithm']['off_policy_correction']}, "
                  f"advantages {config['algorithm']['type']}", highlight=False)
    with EventPublisher(settings) as publisher:
        create_run(settings, into, config, publisher, parent_run_id=source)

    def publish(on_progress) -> int:
        return rp.publish_replay(settings, into, plan, trajectories, evaluations, rescorer, rate, on_progress)

    try:
        replay_locally(settings, into, plan.steps, publish, out, console)
    except RunFailed as exc:
        err_console.print(f"[red]replay failed:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_FAILED)


@app.command()
def demo(
    run: str = typer.Option("demo", help="Run id to create."),
    rollouts: int = typer.Option(2048, help="Synthetic rollouts (each is 8 events, one of every type)."),
) -> None:
    """Push a synthetic run through the whole backbone: its topics on the broker, every
    event type, the ledger sink, then the ledger's answer. Needs `streamrl up`."""
    from rich.progress import Progress

    from consumers.ledger_sink import LedgerSink
    from producers.synthetic import synthetic_events
    from schema.events import RunEvent
    from streamrl.bus import EventPublisher, create_run_topics
    from streamrl.sql import run_readonly

    settings = _settings()
    url = _database_url(settings)
    _check_database(url)
    create_run_topics(settings, run)
    total = rollouts * 8 + 1
    with Progress(console=console) as progress:
        published = progress.add_task("publish to Kafka", total=total)
        with EventPublisher(settings) as publisher:
            publisher.publish(RunEvent(run_id=run, kind="created", name=run, config={"demo": True}))
            for event in synthetic_events(run, rollouts):
                publisher.publish(event)
                progress.advance(published)
            progress.advance(published)
        written = progress.add_task("sink into the ledger", total=total)
        worker = LedgerSink(settings, run_id=run)
        try:
            while worker.stats.rows + worker.stats.dead_letters < total:
                worker.poll_once()
                progress.update(written, completed=worker.stats.rows + worker.stats.dead_letters)
        finally:
            worker.close()
    query = """select 'tasks' as table_name, count(*) as rows from tasks where run_id = %(run)s
       union all select 'trajectories', count(*) from trajectories where run_id = %(run)s
       union all select 'evaluations', count(*) from evaluations where run_id = %(run)s
       union all select 'samples', count(*) from samples where run_id = %(run)s
       union all select 'train_steps', count(*) from train_steps where run_id = %(run)s
       union all select 'weight_versions', count(*) from weight_versions where run_id = %(run)s
       union all select 'run_events', count(*) from run_events where run_id = %(run)s
       union all select 'dead_letters', count(*) from dead_letters where run_id = %(run)s"""
    result = run_readonly(url, query, {"run": run})
    _print_table(result.columns, result.rows)
    console.print(f"Ask the ledger yourself: streamrl sql \"select step, loss from train_steps "
                  f"where run_id = '{run}' order by step limit 5\"")


if __name__ == "__main__":
    app()
