"""`streamrl model init`: a randomly initialised model of a real architecture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamrl.cli.common import UsageError, cli_command, console

model_app = typer.Typer(help="Model folders.", no_args_is_help=True, rich_markup_mode=None)


def register(app: typer.Typer) -> None:
    model_app.command("init")(cli_command(model_init))
    app.add_typer(model_app, name="model")


def model_init(
    config: Annotated[str, typer.Option("--config", help="Architecture: qwen2-0.5b, qwen2-1.5b, qwen2-7b, qwen3-0.6b.")],
    out: Annotated[Path, typer.Option("--out", help="The folder to write (a Hugging Face model folder).")],
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    match_tokenizer_vocab: Annotated[
        bool,
        typer.Option(
            "--match-tokenizer-vocab", help="Shrink the vocabulary to the tokenizer's (for servers that sample every id)."
        ),
    ] = False,
) -> None:
    """Write a randomly initialised model of a real architecture and size, with a
    tokenizer, loadable by from_pretrained: nothing is downloaded."""
    from streamrl.runtime.model_init import init_model, parameter_count

    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: the folder exists and is not empty")
    try:
        folder = init_model(config, out, seed, match_tokenizer_vocab)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    console.print(f"{config}: {parameter_count(folder) / 1e6:,.0f}M parameters in {folder}", highlight=False)
