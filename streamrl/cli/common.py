"""What every command module shares: the consoles, the exit codes, and the one place
where errors become messages and exit codes.

Exit codes: 0 success; 1 the command ran and failed (a refused or failing query, an
unhealthy service, a failed run); 2 bad usage or input (typer's own code); 3 a service
is missing or unreachable.

A command raises; `cli_command` prints one line (or a list of problems) and exits with
the code of the error's kind. No command prints an error or raises typer.Exit itself.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import sys
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from streamrl.runtime.sql import plain_value as plain
from streamrl.runtime.sql import visible

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SERVICE = 3

console = Console()
err_console = Console(stderr=True)


class CliError(Exception):
    """An error with its exit code and the label printed before its message."""

    exit_code = EXIT_FAILED
    label = "error"

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or []


class UsageError(CliError):
    exit_code = EXIT_USAGE


class ServiceMissing(CliError):
    exit_code = EXIT_SERVICE


class CommandFailed(CliError):
    exit_code = EXIT_FAILED

    def __init__(self, message: str, label: str = "error"):
        super().__init__(message)
        self.label = label


def as_cli_error(exc: Exception) -> CliError | None:
    """The CLI meaning of an error raised by the layers below, or None (a bug: re-raised)."""
    from streamrl.runtime.config import ConfigError
    from streamrl.runtime.dataset import DatasetError
    from streamrl.runtime.extras import missing_extra
    from streamrl.runtime.outage import ServiceLost
    from streamrl.runtime.recipe import RecipeError
    from streamrl.runtime.runs import RunNotFound
    from streamrl.runtime.services import ServiceError
    from streamrl.runtime.settings import SettingsError
    from streamrl.runtime.sql import SqlFailed, SqlRefused

    if isinstance(exc, CliError):
        return exc
    missing = missing_extra(exc, f"`streamrl {command_name()}`")
    if missing is not None:
        return CommandFailed(str(missing), "missing extra")
    if isinstance(exc, RecipeError):
        error = UsageError(f"{exc.path}:", exc.problems)
        error.label = "invalid recipe"
        return error
    if isinstance(exc, SqlRefused):
        return CommandFailed(str(exc), "refused")
    if isinstance(exc, SqlFailed):
        return CommandFailed(str(exc), "query failed")
    if isinstance(exc, (SettingsError, DatasetError)):
        return UsageError(str(exc))
    if isinstance(exc, ServiceError):
        return ServiceMissing(str(exc))
    if isinstance(exc, ConfigError):
        return CommandFailed(f"the run's recorded config does not fit this version of StreamRL: {exc}")
    if isinstance(exc, RunNotFound):
        return CommandFailed(str(exc))
    if isinstance(exc, ServiceLost):
        return ServiceMissing(str(exc))
    lost = lost_service_sentence(exc)
    if lost:
        return ServiceMissing(lost)
    # Only a process that loaded the inference code can raise its errors (importing it
    # here would cost every command a torch import).
    inference = sys.modules.get("streamrl.producers.inference")
    if inference is not None and isinstance(exc, inference.InferenceUnavailable):
        # a lost service (exit 3): `streamrl run` does not restart a worker for it
        lost_inference = ServiceMissing(str(exc))
        lost_inference.label = "inference service"
        return lost_inference
    recovery = sys.modules.get("streamrl.consumers.faust_recovery")
    if recovery is not None and isinstance(exc, recovery.RecoveryStalled):
        return CommandFailed(str(exc))  # exit 1: `streamrl run` restarts the processor
    return None


def lost_service_sentence(exc: Exception) -> str | None:
    """One sentence for a service that went away under a command, or None. Only the
    client libraries a command has imported can have raised (no import costs here)."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"PostgreSQL stopped answering ({first}): bring it back (`streamrl up` for the embedded one), "
            "then run the command again (`streamrl run --resume RUN` for a run)."
        )
    kafka_errors = sys.modules.get("kafka.errors")
    if kafka_errors is None:
        return None
    # the error names differ between kafka-python versions
    lost_broker = tuple(
        getattr(kafka_errors, name)
        for name in ("NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError")
        if hasattr(kafka_errors, name)
    )
    if isinstance(exc, lost_broker):
        return (
            f"the Kafka broker stopped answering ({type(exc).__name__}: {exc}): bring it back (`streamrl up` "
            "for the embedded one), then run the command again (`streamrl run --resume RUN` for a run)."
        )
    return None


def debugging() -> bool:
    """`streamrl --debug ...` (inherited by a run's processes): tracebacks as well as messages."""
    return os.environ.get("STREAMRL_DEBUG") == "1"


def report(error: CliError) -> None:
    err_console.print(f"[red]{error.label}:[/] " if not error.problems else f"[red]{error.label}[/] ", end="", highlight=False)
    err_console.print(str(error), highlight=False, markup=False, soft_wrap=True)
    for problem in error.problems:
        err_console.print(f"  - {problem}", highlight=False, markup=False, soft_wrap=True)


def command_name() -> str:
    """The command being run, as the user typed it (`recipe validate`, `ui`)."""
    words = [word for word in sys.argv[1:3] if not word.startswith("-")]
    return " ".join(words[:2] if words[:1] == ["recipe"] else words[:1]) or "streamrl"


def cli_command(fn):
    """Wrap a command: errors of the layers below become one message and an exit code."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except Exception as exc:  # mapped below, or re-raised as a bug
            error = as_cli_error(exc)
            if error is None:
                raise
            if debugging():
                traceback.print_exc()
            report(error)
            raise typer.Exit(error.exit_code) from None

    return run


# --- helpers commands share ---------------------------------------------------------------


def settings():
    from streamrl.runtime.settings import Settings

    return Settings.from_env()


def readonly_url(current=None) -> str:
    """Where users' SQL runs: the ledger as the least-privileged reader role."""
    current = current or settings()
    database_url(current)  # the ledger must be reachable at all
    return current.readonly_database_url


def database_url(current=None) -> str:
    """The ledger's URL, checked reachable (ServiceMissing otherwise)."""
    from streamrl.runtime import services
    from streamrl.runtime.settings import SettingsError

    current = current or settings()
    try:
        url = current.database_url
    except SettingsError as exc:
        raise ServiceMissing(str(exc)) from None
    ok, detail = services.postgres_probe(url)
    if not ok:
        raise ServiceMissing(f"cannot reach PostgreSQL at {services.redact(url)}: {detail}")
    return url


def parse_shard(shard: str) -> tuple[int, int]:
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise UsageError(f"--shard {shard!r}: expected I/N with 0 <= I < N, e.g. 0/2")
    return int(index), int(count)


def sharding(current, shard: str) -> tuple[int, int]:
    """The --shard of a worker or processor, refused unless partitions are assigned by shard."""
    if current.partition_assignment != "shard" and shard != "0/1":
        raise UsageError(
            f"--shard {shard}: partitions are shared by consumer groups "
            "(STREAMRL_PARTITION_ASSIGNMENT=group); set STREAMRL_PARTITION_ASSIGNMENT=shard to shard them"
        )
    return parse_shard(shard)


def checked_run_id(run_id: str, option: str) -> str:
    from streamrl.schema.topics import TopicNameError, validate_run_id

    try:
        validate_run_id(run_id)
    except (TopicNameError, ValueError) as exc:
        raise UsageError(f"{option}: {exc}") from None
    return run_id


def new_run_id(experiment_name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", experiment_name).strip("-") or "run"
    return f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def recipe_file(file: Path) -> Path:
    """The recipe argument as a file: `builtin:NAME` copies the shipped recipe out first."""
    from streamrl.builtin_recipes import resolve_recipe_path

    try:
        return resolve_recipe_path(file, settings().home)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def prepared_recipe(file: Path, overrides: list[str] | None = None, load_code: bool = True):
    """The recipe a run starts from, its `key=value` overrides applied, its own code
    loaded and its registry keys checked: `run`, `publish` and `recipe validate` all
    call this, so validation and a run refuse the same recipes. `load_code=False` is for
    the publisher `streamrl run` starts after checking the same file: the code check
    imports every component, torch included, which the publisher does not need (on a
    small machine that import is seconds of the run's start)."""
    from streamrl.runtime.recipe import prepare_recipe

    recipe = prepare_recipe(file, overrides=overrides)
    if load_code:
        check_recipe_code(file, recipe)
    return recipe


def print_warnings(recipe) -> None:
    from streamrl.data_checks import recipe_warnings

    for line in recipe_warnings(recipe):
        console.print(f"[yellow]warning: {escape(line)}[/]", highlight=False)


def check_recipe_code(file: Path, recipe) -> None:
    """Load the recipe's own code and check its registry keys (RecipeError naming them)."""
    from streamrl.checks import recipe_code_problems
    from streamrl.runtime.recipe import RecipeError

    problems = recipe_code_problems(recipe)
    if problems:
        raise RecipeError(file, problems)


def cell_text(value) -> str:
    return "" if value is None else visible(json.dumps(value) if isinstance(value, (dict, list)) else str(plain(value)))


def print_table(columns: list[str], rows: list[tuple]) -> None:
    """Rows as a table; every cell is text, never markup (a model's response may hold
    "[/bold]" or ":train:"), and its control characters are shown, not sent."""
    table = Table()
    for column in columns:
        table.add_column(Text(visible(str(column))))
    for row in rows:
        table.add_row(*(Text(cell_text(v)) for v in row))
    console.print(table)
    console.print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", style="dim")


def forked_main(command: Any, args: list[str]) -> int:  # the root click.Command typer built
    """`python -m streamrl.cli ARGS` (`command`: the CLI's root) in a child that
    `streamrl run` forked from itself (streamrl.supervise.fork_child). What the parent set
    up for its own terminal is set up again for the child's log: rich's consoles decide at
    construction whether they write colours, and a logging handler of the parent would
    keep the child's own `logging.basicConfig` from taking effect."""
    import logging

    console.__init__()  # type: ignore[misc]
    err_console.__init__(stderr=True)  # type: ignore[misc]
    for handler in logging.root.handlers[:]:
        logging.root.removeHandler(handler)
    command.main(args, prog_name="streamrl")
    return 0
