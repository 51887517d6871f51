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


def assert_mean_rose(before: list[float], after: list[float], what: str, sigmas: float = 3.0) -> float:
    """The mean of `after` exceeds the mean of `before` by at least `sigmas` standard
    errors of the difference, each from its own sample variance (rewards that are not
    0 or 1: partial credit). Returns that standard error."""
    assert len(before) > 1 and len(after) > 1, f"{what}: too few values to measure ({len(before)}, {len(after)})"
    mean_before, mean_after = sum(before) / len(before), sum(after) / len(after)

    def variance(values: list[float], mean: float) -> float:
        return sum((v - mean) ** 2 for v in values) / (len(values) - 1)

    se = math.sqrt(variance(before, mean_before) / len(before) + variance(after, mean_after) / len(after))
    gain = mean_after - mean_before
    assert gain >= sigmas * se and gain > 0, (
        f"{what}: {mean_before:.3f} ({len(before)} values) -> {mean_after:.3f} ({len(after)}), a gain of "
        f"{gain:+.3f}; {sigmas:g} standard errors of that gain are {sigmas * se:.3f}"
    )
    return se
