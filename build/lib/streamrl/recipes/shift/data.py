"""Generated string-shift tasks: a long answer, known exactly, nothing to download.

    "qazwsx...=" -> "rbaxty..."   every letter moved one place on in the alphabet (z -> a)

The answer is as long as the prompt's letters (52 by default), so each rollout samples
about 53 tokens (the letters and the end of the turn): generation, not the event path,
is most of a step's model work, as in real RL post-training where answers run to
hundreds of tokens. Every answer letter sits a fixed distance after its prompt letter,
a pattern a 2-layer model's attention learns quickly; sampling all of them right at
temperature 1 takes it much longer (docs/training.md).
"""

from __future__ import annotations

import random
import string


def shift_text(letters: str, by: int = 1) -> str:
    """Each lowercase letter moved `by` places on, wrapping z to a."""
    alphabet = string.ascii_lowercase
    return "".join(alphabet[(alphabet.index(c) + by) % 26] for c in letters)


def shift_row(letters: str) -> dict:
    return {"prompt": f"{letters}=", "answer": shift_text(letters)}


def split_rows(count: int, val_count: int, seed: int, length: int = 52) -> tuple[list[dict], list[dict]]:
    """Train and held-out validation rows with no prompt in common (random strings of
    `length` letters: a repeat is all but impossible, and is skipped anyway)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    train: list[dict] = []
    val: list[dict] = []
    while len(train) < count:
        letters = "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
        if letters in seen:
            continue
        seen.add(letters)
        (val if len(val) < val_count else train).append(shift_row(letters))
    return train, val
