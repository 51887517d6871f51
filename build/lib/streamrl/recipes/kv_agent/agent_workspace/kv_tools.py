"""The agent's tool: read one key of the task's hidden database."""

from kv_data import CONSONANTS, VOWELS  # a neighbour in the agent workspace


def get(key: str, task: dict) -> str:
    database = task["database"]
    if key in database:
        return database[key]
    if not set(key) <= set(CONSONANTS + VOWELS):
        return f"error: keys are lowercase letters, got {key!r}"
    return f"error: no key {key!r}"
