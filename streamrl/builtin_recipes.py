"""The recipes StreamRL ships (`streamrl.recipes`), run by name: `streamrl run
builtin:arith` or `streamrl recipe copy arith`. A built-in recipe's set-up script writes
its data and model next to it, so a run never works in the installed package's folder:
the recipe is copied out first (into STREAMRL_HOME/recipes/NAME, or where the user asks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import streamrl.recipes

PREFIX = "builtin:"
PACKAGE_DIR = Path(streamrl.recipes.__file__).resolve().parent
# what a copy leaves behind: outputs of earlier runs of the packaged folder, caches
NOT_COPIED = shutil.ignore_patterns("generated", "__pycache__", "*.pyc")


def builtin_names() -> list[str]:
    """The recipes shipped with StreamRL: the package's folders that hold a recipe.yaml."""
    return sorted(path.parent.name for path in PACKAGE_DIR.glob("*/recipe.yaml"))


def builtin_folder(name: str) -> Path:
    if name not in builtin_names():
        raise ValueError(f"{PREFIX}{name}: no built-in recipe of that name (built-in: {', '.join(builtin_names())})")
    return PACKAGE_DIR / name


def copy_recipe(name: str, destination: Path, refresh: bool = False) -> Path:
    """Copy built-in recipe NAME's folder to `destination` and return its recipe.yaml. An
    existing folder is refused unless `refresh` (then the shipped files are written over
    it and what a run generated there is kept)."""
    source = builtin_folder(name)
    if destination.exists() and not refresh:
        raise FileExistsError(f"{destination} exists: choose another destination or remove it")
    shutil.copytree(source, destination, ignore=NOT_COPIED, dirs_exist_ok=refresh)
    return destination / "recipe.yaml"


def resolve_recipe_path(file: Path, home: Path) -> Path:
    """A recipe argument as a file: `builtin:NAME` is the shipped recipe, copied to (and
    refreshed in) HOME/recipes/NAME; anything else is the path as given."""
    text = str(file)
    if not text.startswith(PREFIX):
        return file
    name = text.removeprefix(PREFIX)
    return copy_recipe(name, home / "recipes" / name, refresh=True)
