"""The training service: `streamrl serve-training` (StreamRL's learner behind the Tinker
API) and `streamrl training-key create | list | revoke` (its API keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamrl.cli.common import UsageError, cli_command, console, database_url, print_table, settings

key_app = typer.Typer(
    help="API keys of `streamrl serve-training` (stored hashed in the ledger's PostgreSQL).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def register(app: typer.Typer) -> None:
    app.command("serve-training")(cli_command(serve_training))
    key_app.command("create")(cli_command(key_create))
    key_app.command("list")(cli_command(key_list))
    key_app.command("revoke")(cli_command(key_revoke))
    app.add_typer(key_app, name="training-key")


def _store():
    from streamrl.runtime import db
    from streamrl.training_service.store import ServiceStore

    url = database_url(settings())
    db.upgrade(url)
    return ServiceStore(url)


def served_models(specs: list[str]) -> dict[str, str]:
    """`NAME=FOLDER` or `FOLDER` (named by itself): the base models clients may train."""
    models = {}
    for spec in specs:
        name, _, folder = spec.rpartition("=") if "=" in spec else (spec, "", spec)
        if not (Path(folder) / "config.json").exists():
            raise UsageError(f"--model {spec}: {folder} is not a Hugging Face model folder (no config.json)")
        models[name] = str(Path(folder).absolute())
    return models


def serve_training(
    model: Annotated[
        list[str],
        typer.Option(
            "--model", help="A base model clients may train: NAME=FOLDER, or FOLDER (its name is the folder). Repeat for several."
        ),
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8140,
    root: Annotated[
        Path | None, typer.Option(help="Where states and sampler weights are written (default: STREAMRL_HOME/training-service).")
    ] = None,
    device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")] = "auto",
    limit: Annotated[
        list[str] | None,
        typer.Option(
            "--limit",
            help="A limit over its default, NAME=VALUE (repeat): max_body_bytes, max_decompressed_bytes, "
            "max_tokens_per_datum, max_tokens_per_request, max_sample_sequences, max_sample_tokens, max_new_tokens, "
            "max_sample_seconds, "
            "max_models_per_key, max_sessions_per_key, max_pending_per_key, max_polls_per_key.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the Tinker training API on this machine's GPUs (or CPU): the official `tinker`
    client, tinker-cookbook scripts and recipes with trainer.type remote_api_* train
    here. Sessions, models, requests and checkpoints are kept in the ledger's PostgreSQL, so
    a restarted service finishes what it accepted."""
    from streamrl.runtime.extras import require_extra

    require_extra("service", "`streamrl serve-training`")
    import torch

    from streamrl.runtime.http_server import serve
    from streamrl.training_service.app import build_app
    from streamrl.training_service.executor import Executor
    from streamrl.training_service.limits import ServiceLimits

    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device: {device!r} is not one of auto, cpu, cuda")
    try:
        limits = ServiceLimits.from_pairs(limit or [])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    base_models = served_models(model)
    store = _store()
    chosen = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    home = (root or settings().home / "training-service").absolute()
    executor = Executor(store, home, base_models, chosen, max_sample_seconds=limits.max_sample_seconds)
    try:
        executor.start()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    console.print(f"training service on http://{host}:{port} ({chosen}); models: {', '.join(base_models)}", highlight=False)
    serve(build_app(store, executor, limits), host, port)


def key_create(name: Annotated[str, typer.Argument(help="Who or what the key is for.")]) -> None:
    """Create an API key; it is printed once (only its SHA-256 is stored)."""
    key_id, key = _store().create_key(name)
    console.print(f"{key_id}  {key}", highlight=False)


def key_list() -> None:
    """The keys: id, name, created, revoked."""
    rows = _store().keys()
    print_table(
        ["key_id", "name", "created_at", "revoked_at"],
        [tuple(r[k] for k in ("key_id", "name", "created_at", "revoked_at")) for r in rows],
    )


def key_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (from `list`).")]) -> None:
    """Revoke a key: a running service refuses it at once, its open sessions end (their models leave
    memory within a second) and its requests not yet run fail."""
    if not _store().revoke_key(key_id):
        raise UsageError(f"no key {key_id}")
    console.print(f"revoked {key_id}")
