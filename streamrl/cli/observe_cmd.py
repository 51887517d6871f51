"""Commands that show a run: tracker (feeds W&B / TensorBoard / MLflow from the run's
topics), export (the same from the ledger, for a run that had no tracker) and ui (the
run browser)."""

from __future__ import annotations

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
    readonly_url,
    settings,
)
from streamrl.cli.train_cmd import run_config


def register(app: typer.Typer) -> None:
    for command in (tracker, export, ui):
        app.command()(cli_command(command))


def tracker(run: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """Send RUN's train steps and validation results to the trackers its recipe names
    (logger.backends), as they arrive; a late or restarted tracker catches up. SIGTERM
    logs what the topics already hold, then closes the trackers."""
    from streamrl.consumers.tracker import TrackerFeed
    from streamrl.runtime.runs import stop_on_signals

    stop = stop_on_signals()
    current = settings()
    recipe = run_config(current, checked_run_id(run, "RUN"))
    if not recipe.logger.trackers():
        raise UsageError(f"run {run}'s recipe names no tracker (logger.backends: [wandb, tensorboard, mlflow])")
    feed = TrackerFeed(current, run, recipe)
    try:
        feed.run(stop)
    finally:
        feed.close()
    console.print(f"tracker stopped: {feed.logged_steps} steps, {feed.logged_validations} validations logged", highlight=False)


def export(
    run: Annotated[str, typer.Argument(help="Run id.")],
    to: Annotated[
        list[str],
        typer.Option("--to", help="wandb, tensorboard or mlflow (repeat for several); options from the recipe's logger section."),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write the local trackers here instead: W&B files in OUT/wandb, "
            "TensorBoard in OUT/tensorboard, MLflow in OUT/mlflow.db."
        ),
    ] = None,
) -> None:
    """Send RUN's train steps and validations from the ledger to trackers: a back-fill
    for a run that had none, or lost one (the same W&B / MLflow run is continued)."""
    from streamrl.consumers.tracker import export_from_ledger
    from streamrl.consumers.tracker_backends import open_trackers
    from streamrl.runtime.logger_config import TRACKERS

    unknown = [name for name in to if name not in TRACKERS]
    if unknown:
        raise UsageError(f"--to {unknown[0]}: expected one of {', '.join(TRACKERS)}")
    from streamrl.report import run_config as ledger_run_config
    from streamrl.runtime.config import Recipe

    current = settings()
    config, _ = ledger_run_config(database_url(current), checked_run_id(run, "RUN"))
    if not config:
        raise CommandFailed(f"run {run} is not in the ledger (streamrl runs lists those that are)")
    recipe = Recipe.recorded(config)  # the run's own logger options (project, tags, folders)
    recipe.logger.backend, recipe.logger.backends = "console", list(to)  # type: ignore[arg-type]  # --to takes tracker names only
    if out is not None:
        out = out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        recipe.logger.wandb.dir, recipe.logger.tensorboard.log_dir = str(out), str(out / "tensorboard")
        recipe.logger.mlflow.tracking_uri = f"sqlite:///{out / 'mlflow.db'}"
    trackers = open_trackers(current, run, recipe.to_dict(), recipe.logger)
    try:
        steps, validations = export_from_ledger(database_url(current), run, trackers)
    finally:
        for one in trackers:
            one.close()
    console.print(f"exported {steps} steps and {validations} validations of {run} to {', '.join(to)}", highlight=False)


def ui(
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A Host name the browser answers to (repeat for several); default: the loopback "
            "names, and --host when it is another address.",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="STREAMRL_UI_TOKEN",
            help="The token every request must carry (default: a fresh random one, printed in the URL).",
        ),
    ] = None,
    no_token: Annotated[
        bool,
        typer.Option(
            "--no-token",
            help="Ask no token (loopback only): any page open in this machine's browser can then make it query the ledger.",
        ),
    ] = False,
) -> None:
    """The run browser: runs and their lineage, curves (two runs overlaid), every rollout
    with its tokens, mask, logprobs and advantages, and a read-only SQL box. It reads
    the ledger as the read-only role, and asks every request for the token printed here
    (once in the URL, then a cookie), as Jupyter does."""
    import secrets

    from streamrl.runtime.extras import require_extra

    require_extra("ui", "`streamrl ui`")
    from streamrl.runtime.http_server import serve
    from streamrl.ui.app import LOOPBACK_HOSTS, make_app

    url = readonly_url()
    loopback = host in LOOPBACK_HOSTS
    if no_token and not loopback:
        raise typer.BadParameter(
            f"--no-token serves this machine only; --host {host} would serve the network", param_hint="--no-token"
        )
    if no_token and token:
        raise typer.BadParameter("give a token or --no-token, not both", param_hint="--token")
    hosts = tuple(allowed_host or (LOOPBACK_HOSTS if loopback else (*LOOPBACK_HOSTS, host)))
    token = None if no_token else (token or secrets.token_urlsafe(24))
    shown = f"http://{host}:{port}/" + (f"?token={token}" if token else "")
    console.print(f"StreamRL run browser on {shown} (Ctrl-C stops it)", highlight=False, markup=False)
    serve(make_app(url, hosts, token, port), host, port)
