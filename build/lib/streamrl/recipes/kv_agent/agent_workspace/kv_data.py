"""The key-value task: each row carries a small hidden database; the question names a
key; only the `get` tool can read the database, so the value cannot be guessed or
memorised (keys and values are drawn afresh for every row)."""

from __future__ import annotations

import json
import random

CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
TOOL_NAME = "get"


def make_key(rng: random.Random) -> str:
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(2)) + rng.choice(CONSONANTS)


def tool_call_text(key: str) -> str:
    """What a correct first turn says (compact JSON: a tiny model's context is short)."""
    payload = {"name": TOOL_NAME, "arguments": {"key": key}}
    return f"<tool_call>{json.dumps(payload, separators=(',', ':'))}</tool_call>"


def make_row(rng: random.Random, entries: int = 4) -> dict:
    keys = set()
    while len(keys) < entries:
        keys.add(make_key(rng))
    database = {key: f"{rng.randrange(1000):03d}" for key in sorted(keys)}
    asked = rng.choice(sorted(database))
    answer = database[asked]
    return {
        "prompt": f"key: {asked}",
        "answer": answer,
        "database": database,
        # a worked episode for the supervised warm-up (trainer.warmup_messages_key)
        "demonstration": [
            {"role": "user", "content": f"key: {asked}"},
            {"role": "assistant", "content": tool_call_text(asked)},
            {"role": "tool", "content": answer},
            {"role": "assistant", "content": answer},
        ],
    }
