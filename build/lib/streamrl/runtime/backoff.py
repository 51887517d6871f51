"""Retry waits: exponential with jitter, from tenacity.

Plain retry loops use tenacity's `Retrying` directly. Loops whose control flow is more
than "try again" (a managed server restarted between tries, a lost service given a
deadline across many calls) take only the wait from here, so every wait in StreamRL is
the same jittered exponential: many workers that lost the same server do not come back
in step.
"""

from __future__ import annotations

from types import SimpleNamespace

from tenacity import wait_exponential_jitter


def backoff_wait(initial: float, maximum: float) -> wait_exponential_jitter:
    """initial * 2^(attempt - 1) plus up to `initial` of jitter, at most `maximum`."""
    return wait_exponential_jitter(initial=initial, max=maximum, jitter=initial)


def backoff_delay(attempt: int, initial: float, maximum: float) -> float:
    """The wait before try `attempt + 1` (attempt counts from 1)."""
    return backoff_wait(initial, maximum)(SimpleNamespace(attempt_number=attempt))  # type: ignore[arg-type]  # the wait reads attempt_number only
