"""docs/recipe.md, generated from the typed recipe: every key with its type, default,
range, description and, for a key a registry serves, the registered names
(`python -m streamrl.recipe_reference > docs/recipe.md`; tests/test_docs.py fails when
the file is stale). Here, in the app layer, because only it imports every component and
so every registry."""

from __future__ import annotations

import dataclasses
import typing

import streamrl.checks  # noqa: F401  (fills every registry)
from streamrl.runtime.config import Recipe, _scalar_type
from streamrl.runtime.config_fields import describe_range
from streamrl.runtime.registry import REGISTRIES


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
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
