"""Field helpers of the typed recipe: every field carries its description and, for a
number, its range; `check_against` (runtime/config.py) reads them, and docs/recipe.md is
generated from them (`python -m streamrl.runtime.recipe_reference`)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import MISSING, field


def knob(
    default=MISSING,
    help: str = "",
    *,
    factory=None,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    path: bool = False,
    internal: bool = False,
    **extra,
):
    """A recipe field: its default (or `factory` for a list, mapping or section), what it
    means (`help`), and for a number the bounds it must keep (`ge`/`gt`/`le`/`lt`)."""
    metadata = {"help": help, **extra}
    bounds = {name: value for name, value in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if value is not None}
    if bounds:
        metadata["range"] = bounds
    if path:
        metadata["path"] = True
    if internal:
        metadata["internal"] = True
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=None if default is MISSING else default, metadata=metadata)


def path_field(default=None, help: str = "", **kwargs):
    """A field naming a file or folder that must exist (relative to the recipe's folder)."""
    return knob(default, help or "a file or folder, relative to the recipe's folder", path=True, **kwargs)


def only(default, why: str):
    """A guide key that StreamRL implements for one value: `default`; another is refused."""
    factory = (lambda: type(default)(default)) if isinstance(default, (list, dict)) else None
    return knob(default, f"the guide's key; only {default!r}: {why}", factory=factory, only=why)


def describe_range(bounds: dict) -> str:
    """`{"ge": 0, "le": 1}` -> "between 0 and 1"; `{"gt": 0}` -> "> 0"."""
    low = (">= ", bounds["ge"]) if "ge" in bounds else ("> ", bounds["gt"]) if "gt" in bounds else None
    high = ("<= ", bounds["le"]) if "le" in bounds else ("< ", bounds["lt"]) if "lt" in bounds else None
    if low and high:
        if "ge" in bounds and "le" in bounds:
            return f"between {bounds['ge']} and {bounds['le']}"
        return f"in {'[' if 'ge' in bounds else '('}{low[1]}, {high[1]}{']' if 'le' in bounds else ')'}"
    bound = low or high
    return f"{bound[0]}{bound[1]}" if bound else "any value"


def out_of_range(value, bounds: dict) -> bool:
    return (
        ("ge" in bounds and value < bounds["ge"])
        or ("gt" in bounds and value <= bounds["gt"])
        or ("le" in bounds and value > bounds["le"])
        or ("lt" in bounds and value >= bounds["lt"])
    )


def _scalar_type(tp):
    """`Optional[X]` -> X; a Union of several -> None; anything else as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else None
    return tp


def missing_files(values: dict, schema: type, bases: list, prefix: str = "") -> list[str]:
    """Path keys naming nothing: a relative path is looked up in each of `bases` (the
    recipe's folder, then the working directory, where the guide's paths start)."""
    problems = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        value = values.get(f.name)
        tp = _scalar_type(hints[f.name])
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
            problems += missing_files(value, tp, bases, f"{prefix}{f.name}.")
        elif f.metadata.get("path") and value:
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                where = f"{prefix}{f.name}" + (f"[{i}]" if isinstance(value, list) else "")
                file = re.sub(r"\.py:[A-Za-z_]\w*$", ".py", str(item))  # file.py:Class names a file
                if not any((base / file).exists() for base in bases):
                    problems.append(f"{where}: file not found: {item} (relative to {' or '.join(str(base) for base in bases)})")
    return problems
