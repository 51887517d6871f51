"""Commands for the services a run stands on: up, down, status, db upgrade, topics, demo."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from streamrl.cli.common import (
    EXIT_FAILED,
    EXIT_SERVICE,
    UsageError,
    checked_run_id,
    cli_command,
    console,
    database_url,
    print_table,
    readonly_url,
    settings,
)

db_app = typer.Typer(help="Ledger database maintenance.", no_args_is_help=True, rich_markup_mode=None)


def register(app: typer.Typer) -> None:
    for command in (up, down, status, topics, demo):
        app.command()(cli_command(command))
    db_app.command("upgrade")(cli_command(db_upgrade))
    app.add_typer(db_app, name="db")


def up(
    migrate: Annotated[bool, typer.Option(help="Run the ledger migrations after starting.")] = True,
    only: Annotated[
        str | None, typer.Option(help="broker or ledger: start only that service (a cluster's broker or ledger host).")
    ] = None,
    listen: Annotated[
        str,
        typer.Option(
            help="The address of this host the services listen on: the broker advertises it to clients, and the "
            "ledger's PostgreSQL asks every connection for a password (written to STREAMRL_HOME/ledger.pgpass, "
            "a libpq password file to give the other hosts as PGPASSFILE). Default: this machine only."
        ),
    ] = "127.0.0.1",
) -> None:
    """Start the embedded broker and PostgreSQL (unless external ones are configured) and
    migrate the ledger. Safe to run again: it starts only what is not running."""
    from streamrl.runtime import db, services
    from streamrl.runtime.ledger_server import set_reader_password

    if only is not None and only not in services.SERVICES:
        raise UsageError(f"--only: {only!r} is not one of {', '.join(services.SERVICES)}")
    try:
        services.checked_listen_address(listen)
    except services.ServiceError as exc:
        raise UsageError(str(exc)) from None
    current = settings()
    for line in services.up(current, only, listen):
        console.print(line, highlight=False, soft_wrap=True)
    if migrate and only != "broker":
        url = database_url(current)
        db.upgrade(url)
        ledger = current.read_state().get("postgres") or {}
        if ledger.get("network"):
            set_reader_password(ledger)
        console.print(f"ledger: migrated to revision {db.current_revision(url)}")


def down() -> None:
    """Stop the services that `streamrl up` started here (never external ones)."""
    from streamrl.runtime import services

    for line in services.down(settings()):
        console.print(line)


def status() -> None:
    """Show each service: embedded or external, address, version, the embedded broker's
    memory (it holds the runs' topics in memory) and health."""
    from streamrl.runtime import services

    table = Table("service", "mode", "address", "version", "memory", "health")
    statuses = services.status(settings())
    for s in statuses:
        health = "[green]healthy[/]" if s.healthy else f"[red]down[/] {s.detail}"
        table.add_row(s.name, s.mode, s.address, s.version, s.memory, health)
    console.print(table)
    if any(s.mode == "not configured" for s in statuses):
        raise typer.Exit(EXIT_SERVICE)
    if not all(s.healthy for s in statuses):
        raise typer.Exit(EXIT_FAILED)


def db_upgrade(revision: Annotated[str, typer.Argument(help="Target Alembic revision.")] = "head") -> None:
    """Apply the ledger's Alembic migrations up to REVISION (default: the latest)."""
    from streamrl.runtime import db

    url = database_url()
    db.upgrade(url, revision)
    console.print(f"ledger at revision {db.current_revision(url)}")


def topics(
    run: Annotated[str, typer.Argument(help="Run id.")],
    partitions: Annotated[int | None, typer.Option(help="Partitions per topic (default STREAMRL_TOPIC_PARTITIONS).")] = None,
    remove: Annotated[
        bool,
        typer.Option(
            help="Remove RUN's topics instead, if the ledger holds every event they "
            "carry (a finished `streamrl run` does this itself). Stop the run's "
            "processes first."
        ),
    ] = False,
) -> None:
    """Create RUN's topics (tasks, trajectories, ..., dead_letters) if they do not exist;
    with --remove, free them from the broker once the ledger holds everything."""
    from streamrl.runtime.topic_admin import create_run_topics
    from streamrl.runtime.topic_retention import retire_run_topics
    from streamrl.schema.topics import run_topics

    names = run_topics(checked_run_id(run, "RUN"))
    if remove:
        retired = retire_run_topics(settings(), run)
        console.print(retired.sentence(run), highlight=False, markup=False)
        if retired.behind:
            raise typer.Exit(EXIT_FAILED)
        return
    created = create_run_topics(settings(), run, partitions)
    for name in names.values():
        console.print(f"{name}  {'created' if name in created else 'exists'}")


def demo(
    run: Annotated[str, typer.Option(help="Run id to create.")] = "demo",
    rollouts: Annotated[int, typer.Option(help="Synthetic rollouts (each is 8 events, one of every type).")] = 2048,
) -> None:
    """Push a synthetic run through the whole backbone: its topics on the broker, every
    event type, the ledger sink, then the ledger's answer. Needs `streamrl up`."""
    from streamrl.demo import run_demo

    current = settings()
    result = run_demo(current, readonly_url(current), run, rollouts, console)
    print_table(result.columns, result.rows)
    console.print(
        f'Ask the ledger yourself: streamrl sql "select step, loss from train_steps '
        f"where run_id = '{run}' order by step limit 5\"",
        highlight=False,
        markup=False,
    )
