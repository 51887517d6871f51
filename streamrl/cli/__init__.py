"""The `streamrl` command line: one module per command group, each command a thin
function (parse, call one function that does the work); errors become messages and exit
codes in one place (`common.cli_command`).

    services_cmd  up, down, status, db upgrade, topics, demo
    recipe_cmd    recipe new, recipe validate
    ledger_cmd    sink, runs, sql, show
    train_cmd     run, publish, worker, processor, learner, replay
    model_cmd     model init
    service_cmd   serve-training, training-key
    observe_cmd   tracker, export, ui
"""

from __future__ import annotations

import os

from streamrl.runtime.quiet import kafka_client_errors_in_one_line, quiet_library_progress

quiet_library_progress()

import typer  # noqa: E402

from streamrl.cli import ledger_cmd, model_cmd, observe_cmd, recipe_cmd, service_cmd, services_cmd, train_cmd  # noqa: E402
from streamrl.cli.common import debugging  # noqa: E402

# rich_markup_mode=None: help texts are plain text, so "A:B:" never becomes an emoji and
# "[...]" is never taken for markup.
app = typer.Typer(
    help="StreamRL: event-sourced RL post-training for LLMs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"streamrl {version('streamrl')}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(
        False, "--debug", help="On an error, print its traceback as well as its message (the run's processes inherit it)."
    ),
    show_version: bool = typer.Option(
        False, "--version", callback=print_version, is_eager=True, help="Print StreamRL's version and exit."
    ),
) -> None:
    if debug:
        os.environ["STREAMRL_DEBUG"] = "1"
    if not debugging():  # a run's processes inherit --debug
        kafka_client_errors_in_one_line()


for group in (services_cmd, recipe_cmd, ledger_cmd, train_cmd, model_cmd, service_cmd, observe_cmd):
    group.register(app)

__all__ = ["app"]
