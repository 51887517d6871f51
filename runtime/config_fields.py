"""Field helpers of the typed recipe: a path that must exist, and a guide key StreamRL
implements for one value only."""

from __future__ import annotations

from dataclasses import field


def path_field(default=None, **kwargs):
    """A field naming a file or folder that must exist (relative to the recipe's folder)."""
    return field(default=default, metadata={"path": True}, **kwargs)


def only(default, why: str):
    """A guide key that StreamRL implements for one value: `default`; another is refused."""
    factory = (lambda: type(default)(default)) if isinstance(default, (list, dict)) else None
    metadata = {"only": why}
    return field(default_factory=factory, metadata=metadata) if factory else field(default=default, metadata=metadata)
