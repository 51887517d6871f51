"""Learning margins in standard errors of their measurement.

A held-out accuracy measured on n prompts has a standard error of sqrt(p (1 - p) / n);
the gain between two such measurements (before and after, treated as independent: an
overestimate for the same prompts, so the margin errs on the safe side) has
sqrt(SE_before^2 + SE_after^2). A learning test asserts a gain of at least three of them.
"""

from __future__ import annotations

import math


def gain_standard_error(before: float, after: float, n: int) -> float:
    return math.sqrt((before * (1 - before) + after * (1 - after)) / n)


def assert_learned(before: float, after: float, n: int, what: str, sigmas: float = 3.0) -> None:
    """`after - before` is at least `sigmas` standard errors of the gain (and positive)."""
    se = max(gain_standard_error(before, after, n), 0.5 / n)  # at 0 or 1 the binomial SE vanishes: one prompt's worth
    gain = after - before
    assert gain >= sigmas * se, (
        f"{what}: {before:.3f} -> {after:.3f} on {n} held-out prompts, a gain of {gain:+.3f}; "
        f"{sigmas:g} standard errors of that gain are {sigmas * se:.3f}"
    )
