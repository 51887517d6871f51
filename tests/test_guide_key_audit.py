"""An audit of every recipe key the guide shows (each YAML block of `shared/seeds/`): each
is taken into a recipe field that StreamRL's code reads, moved to StreamRL's spelling of
it, accepted only with the one value StreamRL honours, or refused with its own path
named. None is accepted and ignored. The keys of the guide's other YAML (agent, tool and
interaction configs) are run by the listings' tests (tests/seed_examples)."""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from pathlib import Path

import pytest
import yaml

from streamrl.runtime.config import Recipe
from streamrl.runtime.guide_forms import MOVED, REFUSED
from streamrl.runtime.recipe import RecipeError, load_recipe
from tests.conftest import REPO

SEEDS = REPO.parent / "shared" / "seeds"
# the guide's text lives beside the checkout, not in it: its YAML blocks are copied here as
# printed (FFF_NN.yaml: block NN of chapter FFF), so the audit runs in any clone, and the
# copies are checked against the guide wherever it is beside the checkout
BLOCKS = REPO / "tests" / "seed_examples" / "yaml"
needs_the_guide = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the guide's text is not at {SEEDS}")
# where recipe fields are declared, converted or described rather than read
NOT_READERS = {
    "runtime/config.py",
    "runtime/config_fields.py",
    "runtime/service_config.py",
    "runtime/verl_keys.py",
    "runtime/guide_forms.py",
    "runtime/inert_keys.py",
    "streamrl/recipe_reference.py",
}
PACKAGES = ("streamrl", "runtime", "algos", "producers", "consumers", "learner", "training_service", "schema", "contrib")
# a remote trainer's keys are read only with one: given alone they are refused for that
REMOTE = {"trainer": {"type": "remote_api_grpo"}, "service": {"train_service": {"backend": "tinker"}}}


def recipe_fields(cls=Recipe, prefix: str = ""):
    """(dotted path, field) of every leaf field of the recipe."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints.get(field.name)):
            yield from recipe_fields(hints[field.name], prefix + field.name + ".")
        else:
            yield prefix + field.name, field


def test_every_recipe_field_is_read_by_the_code_or_accepts_one_value():
    """A field nothing reads would be a key accepted and ignored. "Read" is an attribute
    access or a string subscript of its name in a module that does not declare fields."""
    sources = [
        p.read_text()
        for package in PACKAGES
        for p in (REPO / package).rglob("*.py")
        if str(p.relative_to(REPO)) not in NOT_READERS
    ]
    unread = []
    for path, field in recipe_fields():
        name = path.rsplit(".", 1)[-1]
        reader = re.compile(rf"\.{name}\b|[\"']{name}[\"']")
        if "only" not in field.metadata and not any(reader.search(source) for source in sources):
            unread.append(path)
    assert unread == []


def guide_yaml_blocks() -> dict[str, str]:
    """The guide's YAML blocks as printed, by `FFF_NN` (chapter, block)."""
    return {
        f"{document.name[:3]}_{number:02d}": block
        for document in sorted(SEEDS.glob("[0-9][0-9][0-9]_*.txt"))
        for number, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", document.read_text(), re.S))
    }


@needs_the_guide
def test_the_copied_yaml_blocks_are_the_guides_as_printed():
    copies = {p.stem: p.read_text() for p in BLOCKS.glob("*.yaml")}
    assert copies == guide_yaml_blocks()


def guide_recipe_keys() -> dict[str, tuple[object, str]]:
    """Every leaf key of the guide's recipe-shaped YAML blocks: its value, and its block."""
    sections = {field.name for field in dataclasses.fields(Recipe)} | set(REFUSED) | {"train_service", "defaults"}
    keys: dict[str, tuple[object, str]] = {}
    for block in sorted(BLOCKS.glob("*.yaml")):
        data = yaml.safe_load(block.read_text())
        if isinstance(data, dict) and set(data) & sections:
            for path, value in leaves(data):
                keys.setdefault(path, (value, block.stem))
    return keys


def leaves(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def moved(path: str) -> str:
    """StreamRL's spelling of a guide key (MOVED's longest matching prefix, until none does)."""
    for old in sorted(MOVED, key=len, reverse=True):
        if path == old or path.startswith(old + "."):
            return moved(MOVED[old][0] + path[len(old) :])
    return path


def nested(path: str, value) -> dict:
    for key in reversed(path.split(".")):
        value = {key: value}
    return value


def merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def present(values: dict, path: str) -> bool:
    for key in path.split("."):
        if not isinstance(values, dict) or key not in values:
            return False
        values = values[key]
    return True


def changed(before: dict, after: dict, prefix: str = "") -> list[str]:
    """The leaf paths whose values differ between two recipes' mappings."""
    paths = []
    for key in after:
        if isinstance(after[key], dict) and isinstance(before.get(key), dict):
            paths += changed(before[key], after[key], f"{prefix}{key}.")
        elif before.get(key) != after[key]:
            paths.append(prefix + key)
    return paths


@functools.cache
def base_recipe(remote: bool, tmp_path: Path) -> dict:
    """The recipe's values with nothing but the context set (what a key is compared with)."""
    recipe_file = tmp_path / "base.yaml"
    recipe_file.write_text(yaml.safe_dump(REMOTE if remote else {}))
    return load_recipe(recipe_file).to_dict()


def fate(path: str, value, tmp_path: Path) -> str:
    """What loading a recipe with this one key (in the context it needs) makes of it."""
    streamrl_path = moved(path)
    base = REMOTE if streamrl_path.startswith("service.train_service") else {}
    recipe_file = tmp_path / "audit.yaml"
    without = base_recipe(bool(base), tmp_path)
    recipe_file.write_text(yaml.safe_dump(merged(base, nested(path, value))))
    try:
        recipe = load_recipe(recipe_file)
    except RecipeError as refusal:
        named = [problem.split(":")[0] for problem in refusal.problems]
        own = [n for n in named if any(n.startswith(p) or p.startswith(n.split("[")[0]) for p in (path, streamrl_path))]
        return f"refused: {own[0]}" if own else f"refused for another key: {refusal.problems}"
    if present(recipe.to_dict(), streamrl_path):
        return "taken" if streamrl_path == path else f"moved to {streamrl_path}"
    if where := changed(without, recipe.to_dict()):  # moved where the recipe's own rule puts it
        return f"moved to {where[0]}"
    top = path.split(".")[0]
    if top in REFUSED and value in REFUSED[top][0]:
        return f"accepted only as {value!r}"
    return "accepted and not in the recipe"


def test_every_key_the_guide_shows_is_taken_moved_or_refused_by_name(tmp_path):
    keys = guide_recipe_keys()
    assert len(keys) >= 100  # the guide's recipe blocks: 116 distinct keys on 2026-11-28
    fates = {path: fate(path, value, tmp_path) for path, (value, _) in keys.items()}
    silent = {path: outcome for path, outcome in fates.items() if outcome.startswith(("accepted and", "refused for another"))}
    assert silent == {}
    kinds = {outcome.split(":")[0].split(" to ")[0].split(" as ")[0] for outcome in fates.values()}
    assert kinds <= {"taken", "moved", "refused", "accepted only"}


@pytest.mark.parametrize(
    "path, expected",
    [
        ("trainer.max_prompt_length", "moved to rollout_worker.max_prompt_length"),
        ("rollout_worker.tokenizer", "refused: rollout_worker.tokenizer"),
        ("resource.training.gpu_count", "refused: resource"),
        ("launch_mode", "accepted only as 'local'"),
    ],
)
def test_the_audit_tells_the_fates_apart(path, expected, tmp_path):
    value = {"rollout_worker.tokenizer": "Qwen/Qwen2.5-7B-Instruct", "launch_mode": "local"}.get(path, 8)
    assert fate(path, value, tmp_path) == expected
