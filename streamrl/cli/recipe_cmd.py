"""`streamrl recipe new` and `streamrl recipe validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamrl.cli.common import UsageError, cli_command, console

recipe_app = typer.Typer(help="Recipes: YAML with defaults: composition and ${oc.env:VAR,default}.",
                         no_args_is_help=True, rich_markup_mode=None)


def register(app: typer.Typer) -> None:
    recipe_app.command("new")(cli_command(recipe_new))
    recipe_app.command("validate")(cli_command(recipe_validate))
    app.add_typer(recipe_app, name="recipe")


def recipe_new(
    name: Annotated[str, typer.Argument(help="The recipe's name (letters, digits, underscores).")],
    directory: Annotated[Path, typer.Option("--dir", help="Where to create the recipe's folder.")] = Path("recipes"),
) -> None:
    """Scaffold a recipe folder: common.yaml, NAME.yaml, NAME.env.sh, setup.py and an
    agent_workspace/ (agent config, tools, evaluator, a custom worker), ready to run."""
    from streamrl.scaffold import scaffold_recipe

    try:
        folder = scaffold_recipe(name, directory)
    except (ValueError, FileExistsError) as exc:
        raise UsageError(str(exc)) from None
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        console.print(f"  {path}", highlight=False)
    console.print(f"run it: streamrl run {folder / (name + '.yaml')}", highlight=False)


def recipe_validate(
    file: Annotated[Path, typer.Argument(help="The recipe YAML.")],
    show: Annotated[bool, typer.Option("--show", help="Print the fully resolved recipe.")] = False,
) -> None:
    """Check a recipe: unknown keys, wrong types, refused values, missing files and
    settings that contradict each other, each with its key path, and the names its
    registry keys use (exit 2 if any)."""
    import copy

    import yaml

    from runtime.plugins import LoadError, load_module
    from runtime.recipe import RecipeError, consistency_problems, load_recipe, resolve_paths
    from runtime.registry import registry_problems
    from streamrl import checks  # noqa: F401  (imports the components: their registries fill)

    recipe = load_recipe(file)
    # A recipe's own advantage estimators register when their module loads (the path
    # resolved on a copy: --show prints the recipe as written).
    estimators = resolve_paths(copy.deepcopy(recipe), file.resolve().parent).algorithm.custom_advantage_module_path
    try:
        if estimators:
            load_module(estimators)
    except LoadError as exc:
        raise RecipeError(file, [f"algorithm.custom_advantage_module_path: {exc}"]) from None
    problems = registry_problems(recipe.to_dict()) + consistency_problems(recipe)
    if problems:
        raise RecipeError(file, problems)
    if show:
        console.print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), highlight=False, markup=False)
    console.print(f"{file}: valid ({recipe.project_name}/{recipe.experiment_name}, "
                  f"trainer {recipe.trainer.type}, {recipe.algorithm.type} advantages, "
                  f"{recipe.weight.sync_mode} weight sync)", highlight=False)
