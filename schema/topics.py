"""Per-run topic names: `streamrl.<run_id>.<kind>`.

One set of topics per run keeps retention, deletion and replay per run. Kafka topic
names allow [A-Za-z0-9._-] up to 249 characters; run ids are restricted so that every
topic name built from them is legal and the run id can be read back from the name.
"""

from __future__ import annotations

import functools
import re

from schema.events import EVENT_BY_KIND

TOPIC_PREFIX = "streamrl"
KINDS = tuple(EVENT_BY_KIND)  # tasks, trajectories, ..., runs, dead_letters
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,199}$")
_TOPIC_PATTERN = re.compile(rf"^{TOPIC_PREFIX}\.([A-Za-z0-9][A-Za-z0-9_-]*)\.([a-z_]+)$")


class TopicNameError(ValueError):
    pass


def validate_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id):
        raise TopicNameError(
            f"run id {run_id!r} is not valid: use 1-200 characters from [A-Za-z0-9_-], "
            "starting with a letter or digit (no dots: they separate topic name parts)"
        )
    return run_id


@functools.lru_cache(maxsize=4096)  # every event sent asks; the answer never changes
def topic_name(run_id: str, kind: str) -> str:
    if kind not in KINDS:
        raise TopicNameError(f"unknown topic kind {kind!r}; expected one of {', '.join(KINDS)}")
    return f"{TOPIC_PREFIX}.{validate_run_id(run_id)}.{kind}"


def run_topics(run_id: str) -> dict[str, str]:
    return {kind: topic_name(run_id, kind) for kind in KINDS}


def parse_topic(topic: str) -> tuple[str, str] | None:
    """(run_id, kind) of a StreamRL topic, or None for any other topic."""
    match = _TOPIC_PATTERN.match(topic)
    if not match or match.group(2) not in KINDS:
        return None
    return match.group(1), match.group(2)


def all_runs_pattern() -> str:
    """Regex subscribing to every StreamRL topic of every run."""
    return rf"^{TOPIC_PREFIX}\..+\.({'|'.join(KINDS)})$"


def run_pattern(run_id: str) -> str:
    return rf"^{TOPIC_PREFIX}\.{re.escape(validate_run_id(run_id))}\.({'|'.join(KINDS)})$"


def event_key(event) -> bytes:
    """Partition key: a whole GRPO group shares a partition; run-level events by run id."""
    group_id = getattr(event, "group_id", None)
    return (group_id or event.run_id).encode()
