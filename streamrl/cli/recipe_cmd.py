"""`streamrl recipe new`, `validate`, `copy` and `list`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamrl.cli.common import UsageError, cli_command, console

recipe_app = typer.Typer(
    help="Recipes: YAML with defaults: composition and ${oc.env:VAR,default}.", no_args_is_help=True, rich_markup_mode=None
)


def register(app: typer.Typer) -> None:
    recipe_app.command("new")(cli_command(recipe_new))
    recipe_app.command("validate")(cli_command(recipe_validate))
    recipe_app.command("copy")(cli_command(recipe_copy))
    recipe_app.command("list")(cli_command(recipe_list))
    app.add_typer(recipe_app, name="recipe")


def recipe_new(
    name: Annotated[str, typer.Argument(help="The recipe's name (letters, digits, underscores).")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to create the recipe's folder.")] = Path("recipes"),
    template: Annotated[
        str,
        typer.Option("--template", help="agent (a tool-using agent) or single-turn (one completion of a chat-message prompt)."),
    ] = "agent",
) -> None:
    """Scaffold a recipe folder, ready to run: common.yaml, NAME.yaml, NAME.env.sh,
    setup.py, and an agent_workspace/ (agent config, tools, evaluator, a custom worker)
    or, for single-turn, evaluator.py and a parquet of chat-message prompts."""
    from streamrl.scaffold import scaffold_recipe

    try:
        folder = scaffold_recipe(name, directory, template)
    except (ValueError, FileExistsError) as exc:
        raise UsageError(str(exc)) from None
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        console.print(f"  {path}", highlight=False)
    console.print(f"run it: streamrl run {folder / (name + '.yaml')}", highlight=False)


def recipe_copy(
    name: Annotated[str, typer.Argument(help="A built-in recipe (`streamrl recipe list`).")],
    destination: Annotated[Path | None, typer.Argument(help="The folder to write (default: ./NAME).")] = None,
) -> None:
    """Write out a recipe StreamRL ships, to read, change and run: `streamrl recipe copy
    arith` then `streamrl run arith/recipe.yaml`. (`streamrl run builtin:arith` runs it
    unchanged.)"""
    from streamrl.builtin_recipes import copy_recipe

    try:
        recipe = copy_recipe(name.removeprefix("builtin:"), destination or Path(name.removeprefix("builtin:")))
    except (ValueError, FileExistsError) as exc:
        raise UsageError(str(exc)) from None
    console.print(f"run it: streamrl run {recipe}", highlight=False)


def recipe_list() -> None:
    """The recipes StreamRL ships, each runnable as `streamrl run builtin:NAME`."""
    from streamrl.builtin_recipes import builtin_folder, builtin_names

    for name in builtin_names():
        first = (builtin_folder(name) / "recipe.yaml").read_text().splitlines()[0].lstrip("# ")
        console.print(f"builtin:{name}  {first}", highlight=False, markup=False)


def check_inference_url(url: str) -> None:
    """An inference server answers at `url` (its /health, as SGLang and vLLM serve it)."""
    import httpx

    from streamrl.cli.common import CommandFailed

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        raise CommandFailed(f"--inference-url {url}: no answer from {url}/health ({type(exc).__name__})") from None


def recipe_validate(
    file: Annotated[Path, typer.Argument(help="The recipe YAML, or builtin:NAME.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Overrides, key.path=value, as `streamrl run` takes them.", show_default=False)
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="Print the fully resolved recipe.")] = False,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode",
            "-m",
            help="As `streamrl run -m`: self-hosted or training-service; refused when the trainer is not that kind.",
        ),
    ] = None,
    inference_url: Annotated[
        list[str] | None,
        typer.Option(
            "--inference-url", help="As `streamrl run --inference-url`: refused unless the backend is sglang or openai."
        ),
    ] = None,
    check_services: Annotated[
        bool, typer.Option("--check-services", help="Also check that the training service and the inference URLs answer now.")
    ] = False,
) -> None:
    """Check a recipe exactly as `streamrl run` does before it starts anything: its
    environment and set-up scripts, unknown keys, wrong types, refused values, missing
    files, settings that contradict each other, its rows, its own code (evaluator,
    worker, trainer, estimator), the names its registry keys use and what `-m` and
    `--inference-url` add, each with its key path (exit 2 if any)."""
    import yaml

    from streamrl.cli.common import prepared_recipe, print_warnings, recipe_file
    from streamrl.cli.train_cmd import check_mode, check_training_service, with_url

    file = recipe_file(file)
    recipe = with_url(prepared_recipe(file, overrides), inference_url)
    check_mode(mode, recipe)
    print_warnings(recipe)
    if check_services:
        check_training_service(recipe)
        from streamrl.runtime.recipe import server_urls

        for url in server_urls(recipe.service.inference_service.url):
            check_inference_url(url)
    if show:
        console.print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), highlight=False, markup=False)
    console.print(
        f"{file}: valid ({recipe.project_name}/{recipe.experiment_name}, "
        f"trainer {recipe.trainer.type}, {recipe.algorithm.type} advantages, "
        f"{recipe.weight.sync_mode} weight sync)",
        highlight=False,
    )
