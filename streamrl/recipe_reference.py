"""docs/recipe.md, generated from the typed recipe: every key with its type, default,
range, description and, for a key a registry serves, the registered names
(`python -m streamrl.recipe_reference > docs/recipe.md`; tests/test_docs.py fails when
the file is stale). Here, in the app layer, because only it imports every component and
so every registry."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

import streamrl.checks  # noqa: F401  (fills every registry)
from streamrl.runtime.config import Recipe, _scalar_type
from streamrl.runtime.config_fields import describe_range
from streamrl.runtime.registry import REGISTRIES
from streamrl.runtime.verl_keys import SAME_NAME, VERL_KEYS


def type_name(tp) -> str:
    text = getattr(tp, "__name__", None) if not typing.get_args(tp) else None
    text = text or str(tp).replace("typing.", "")
    return text.replace("NoneType", "null").replace("|", "or")


def default_of(spec: dataclasses.Field):
    if spec.default is not dataclasses.MISSING:
        value = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
    else:
        return ""
    if value is None:
        return "null"
    return f"`{value!r}`" if value != "" else '`""`'


def rows(schema: type, prefix: str = ""):
    hints = typing.get_type_hints(schema)
    for spec in dataclasses.fields(schema):
        if spec.metadata.get("internal"):
            continue
        key, tp = f"{prefix}{spec.name}", hints[spec.name]
        section = _scalar_type(tp)
        if isinstance(section, type) and dataclasses.is_dataclass(section):
            yield key, None, spec
            yield from rows(section, key + ".")
        else:
            yield key, tp, spec


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render() -> str:
    lines = [
        "# Recipe reference",
        "",
        "Generated from the typed recipe (`runtime/config.py`; `python -m streamrl.recipe_reference >",
        "docs/recipe.md`). A key outside its range, of the wrong type or unknown is refused by",
        "`streamrl recipe validate` with its path; a key a registry serves takes a registered name (a",
        "recipe's own plugins add more).",
        "",
        "## top level",
        "",
        "| key | type | default | range | description |",
        "|---|---|---|---|---|",
    ]
    for key, tp, spec in rows(Recipe):
        if tp is None:
            lines += [
                "",
                f"## `{key}`",
                "",
                cell(spec.metadata.get("help", "")),
                "",
                "| key | type | default | range | description |",
                "|---|---|---|---|---|",
            ]
            continue
        description = spec.metadata.get("help", "")
        registry = REGISTRIES.get(key)
        if registry is not None:
            description += f" (registered: {', '.join(registry.names())})"
        bounds = spec.metadata.get("range")
        lines.append(
            f"| `{key}` | {cell(type_name(tp))} | {cell(default_of(spec))} | "
            f"{describe_range(bounds) if bounds else ''} | {cell(description)} |"
        )
    return "\n".join(lines + verl_section()) + "\n"


def verl_section() -> list[str]:
    lines = [
        "",
        "## verl's keys",
        "",
        "verl's names (its `ppo_trainer.yaml`) work in recipes and `key=value` overrides: each",
        "moves to the StreamRL key beside it before the recipe is checked, and the run records",
        "StreamRL's key (`runtime/verl_keys.py`). A value StreamRL cannot honour, or a verl key",
        "not listed here, is refused with the reason.",
        "",
        "| verl key | StreamRL key | values |",
        "|---|---|---|",
    ]
    for verl_key, spec in VERL_KEYS.items():
        target = ", ".join(f"`{key}`" for key in spec.streamrl) or "(what StreamRL does)"
        lines.append(f"| `{verl_key}` | {target} | {cell(spec.note())} |")
    lines += [f"| `{key}` | `{key}` | the same name and meaning |" for key in SAME_NAME]
    return lines


# the README's table: the verl keys a newcomer from verl looks for first, with TRL's names
README_KEYS = {
    "data.train_files": "",
    "data.val_files": "",
    "data.train_batch_size": "",
    "actor_rollout_ref.rollout.n": "`num_generations`",
    "actor_rollout_ref.actor.optim.lr": "`learning_rate`",
    "algorithm.adv_estimator": "",
    "actor_rollout_ref.actor.clip_ratio_low": "`epsilon`",
    "actor_rollout_ref.actor.clip_ratio_high": "`epsilon_high`",
    "actor_rollout_ref.rollout.response_length": "`max_completion_length`",
}
README_BEGIN, README_END = "<!-- verl-keys: python -m streamrl.recipe_reference --readme -->", "<!-- /verl-keys -->"


def readme_table() -> str:
    lines = [README_BEGIN, "| verl (accepted as written) | TRL | StreamRL |", "|---|---|---|"]
    for verl_key, trl in README_KEYS.items():
        lines.append(f"| `{verl_key}` | {trl} | {', '.join(f'`{k}`' for k in VERL_KEYS[verl_key].streamrl)} |")
    return "\n".join([*lines, README_END])


def write_readme_table(readme: Path) -> None:
    text = readme.read_text()
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    readme.write_text(text[:start] + readme_table() + text[end:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--readme"]:
        write_readme_table(Path(__file__).resolve().parents[1] / "README.md")
    else:
        print(render(), end="")
