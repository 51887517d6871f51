"""Registries: one style for every pluggable kind, in the manner of verl's
`register_policy_loss`.

    ADVANTAGE_ESTIMATORS = Registry("advantage estimator", "algorithm.type")

    @ADVANTAGE_ESTIMATORS.register("grpo")
    def grpo_advantages(rewards): ...

A registry is a name -> object mapping with one decorator and one signature per kind
(the module that creates it documents the signature). Every registry is listed in
`REGISTRIES` under the recipe key it serves, so recipe validation reads the allowed
values from the registries themselves (`registry_problems`): no second list of names
anywhere. A recipe or plugin registers its own with the same decorator.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no registry entry has. A KeyError (a lookup) and a ValueError (bad input)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# recipe key path -> the registry of its allowed values
REGISTRIES: dict[str, Registry] = {}


class Registry(Generic[T]):
    def __init__(self, kind: str, recipe_key: str | None, reserved: dict[str, str] | None = None):
        """`recipe_key`: the recipe key whose values this registry's names are (None for a
        registry a recipe names another way, like `builtin:NAME` evaluators).
        `reserved`: names the recipe may use that resolve elsewhere, with what they mean
        (`trainer.type: custom` is the class `trainer.custom_trainer_module_path` names)."""
        if recipe_key in REGISTRIES:
            raise ValueError(f"a registry for {recipe_key} already exists")
        self.kind, self.recipe_key = kind, recipe_key
        self.reserved = dict(reserved or {})
        self._entries: dict[str, T] = {}
        self._unlisted: set[str] = set()  # entries code chooses, never a recipe
        if recipe_key:
            REGISTRIES[recipe_key] = self

    def register(self, name: str, *, replace: bool = False, in_recipes: bool = True) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name")` over a function or class.
        `in_recipes=False`: an entry only code chooses (the cluster twin's modelled GPUs):
        `get` finds it, a recipe naming it is refused, and the reference does not list it."""

        def add(entry: T) -> T:
            if name in self._entries and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            if not in_recipes:
                self._unlisted.add(name)
            return entry

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(self.unknown(name)) from None

    def unknown(self, name) -> str:
        if name in self._unlisted:
            return f"{self.kind} {name!r} is chosen by code, not by a recipe; a recipe may name: {', '.join(self.names())}"
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}{hint}"

    def pop(self, name: str) -> T:
        """Unregister (tests that register a throw-away entry clean up with this)."""
        return self._entries.pop(name)

    def names(self) -> list[str]:
        """What a recipe may write: the registered names and the reserved ones."""
        return sorted((set(self._entries) - self._unlisted) | set(self.reserved))

    def accepts(self, name: object) -> bool:
        """Whether a recipe may write `name`: registered, or reserved."""
        return (name in self._entries and name not in self._unlisted) or name in self.reserved

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def registry_problems(values: dict, registries: dict[str, Registry] | None = None) -> list[str]:
    """Every recipe key served by a registry, checked against the registry's names.
    `values` is the recipe as a nested mapping (`Recipe.to_dict()`)."""
    problems = []
    for key, registry in sorted((registries or REGISTRIES).items()):
        value: Any = values
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and not registry.accepts(value):
            problems.append(f"{key}: {registry.unknown(value)}")
    return problems
