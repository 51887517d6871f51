"""The layer folders are top-level packages (schema, runtime, algos, ...), as the design
card lays them out; some of those names are also projects on PyPI. If one of them is
installed where Python looks first, StreamRL would import it instead of its own layer
and fail somewhere far away. This check names the clash before anything is imported
(docs/decisions.md, "Top-level import names")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

LAYERS = ("schema", "runtime", "algos", "producers", "consumers", "learner", "training_service", "migrations",
          "recipes")
ROOT = Path(__file__).resolve().parent.parent  # the folder holding streamrl/ and its sibling layers


def layer_problems() -> list[str]:
    """One sentence per layer name that resolves to something other than StreamRL's folder."""
    problems = []
    for name in LAYERS:
        spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if spec is None or not any(Path(location).resolve() == ROOT / name for location in locations):
            where = ", ".join(locations) or (spec.origin if spec else "nowhere")
            problems.append(f"the package {name!r} resolves to {where}, not StreamRL's {ROOT / name}: another "
                            f"project named {name!r} is installed ahead of it; use an environment without it")
    return problems
