"""Names a client gives (saved states, sampler weights) are names, never paths."""

from __future__ import annotations

import re

from fastapi import HTTPException

CHECKPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def checkpoint_name(name: str | None, field_name: str) -> str | None:
    """A client's name for a saved state or sampler weights: one path segment of letters,
    digits, `.`, `_` and `-` (at most 128, not starting with a dot), or a 400 naming the
    field. Names are names, never paths: they go under the caller's own model folder."""
    if name is None:
        return None
    if not isinstance(name, str) or not CHECKPOINT_NAME.fullmatch(name) or ".." in name:
        raise HTTPException(
            400,
            f"{field_name}: {str(name)[:80]!r} is not a checkpoint name (one path segment of "
            "letters, digits, '.', '_' and '-', at most 128 characters)",
        )
    return name
