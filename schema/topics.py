"""Per-run topic names: `streamrl.<run_id>.<kind>`, and `streamrl.<run_id>.<kind>.w<N>`
for the step windows of a run whose topics rotate.

One set of topics per run keeps retention, deletion and replay per run. Kafka topic
names allow [A-Za-z0-9._-] up to 249 characters; run ids are restricted so that every
topic name built from them is legal and the run id can be read back from the name.

Rotation (`service.broker.window_steps: W`): the events of step s of the kinds that grow
with the run (`ROTATED_KINDS`) go to window s // W's topic, so a window's topics can
leave the broker once the ledger holds them and nothing will read them again
(runtime/topic_windows.py). The plain topic of a rotated kind stays, empty: it anchors
the run's readers and the broker-loss watch. Every process of a run learns the window
size from the run's recipe (`set_window_steps`, called where a process reads it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

from streamrl.schema.events import EVENT_BY_KIND, Event

TOPIC_PREFIX = "streamrl"
KINDS = tuple(EVENT_BY_KIND)  # tasks, trajectories, ..., runs, dead_letters
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,199}$")
_TOPIC_PATTERN = re.compile(rf"^{TOPIC_PREFIX}\.([A-Za-z0-9][A-Za-z0-9_-]*)\.([a-z_]+)(?:\.w(\d+))?$")
# The kinds whose events carry a step and grow with the run; the others (a record per
# step or per version at most, or per run) are read whole by late readers and stay.
ROTATED_KINDS = ("tasks", "trajectories", "evaluations", "samples", "steps")
WINDOW_SUFFIX = re.compile(r"\.w(\d+)$")
# run id -> steps per topic window, for the runs this process publishes to (absent: none)
_WINDOW_STEPS: dict[str, int] = {}


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


def window_topic(run_id: str, kind: str, window: int) -> str:
    if kind not in ROTATED_KINDS:
        raise TopicNameError(f"the {kind!r} topic does not rotate; rotated kinds: {', '.join(ROTATED_KINDS)}")
    return f"{topic_name(run_id, kind)}.w{window:06d}"


def set_window_steps(run_id: str, window_steps: int | None) -> None:
    """Record the run's window size (None: its topics do not rotate) for `topic_for`."""
    if window_steps is None:
        _WINDOW_STEPS.pop(run_id, None)
    else:
        _WINDOW_STEPS[run_id] = int(window_steps)


def rotates(run_id: str) -> bool:
    """Whether this process knows the run's topics to rotate."""
    return run_id in _WINDOW_STEPS


def topic_for(event: Event) -> tuple[str, int | None]:
    """The topic an event goes to, and its window (None: the kind's plain topic)."""
    window_steps = _WINDOW_STEPS.get(event.run_id)
    if window_steps is None or event.KIND not in ROTATED_KINDS:
        return topic_name(event.run_id, event.KIND), None
    window = max(event.step, 0) // window_steps  # type: ignore[attr-defined]  # every rotated kind has a step
    return window_topic(event.run_id, event.KIND, window), window


def topic_window(topic: str) -> int | None:
    """The window of a rotated topic's name, None for a plain one."""
    match = WINDOW_SUFFIX.search(topic)
    return int(match.group(1)) if match else None


# A reader holds the newest windows, this many in all: the next window (made ahead, so
# that readers hold it before its first event), the current one and those before it. The
# writers are at most `weight.staleness_threshold` + 1 steps ahead of the learner, and a
# window is longer than that (runtime/service_config.py checks it), so every step not
# yet trained is in one of them. A window leaves the broker only after it fell out of
# every reader's hold (runtime/topic_windows.py).
HELD_WINDOWS = 4
# The most windows of a run the broker holds: the readers' hold (the one made ahead
# among them) and the two before it, which wait for a snapshot past them, for every
# reader to look again and for the ledger (runtime/topic_windows.py). The run's task
# publisher waits for the ledger sink before it opens a window past this
# (runtime/topic_admin.py WindowTopics), so a long run's broker memory is bounded
# whatever the sink's pace; a straggler's window made again adds one for a while.
BROKER_WINDOWS = HELD_WINDOWS + 2
# A publisher's producer writes to the newest this many windows it opened (runtime/
# topic_admin.py WindowTopics says why): it lets go of a window before readers do.
WRITTEN_WINDOWS = 2


def recent_windows(window: int, newest: int) -> bool:
    """The readers' default hold: the newest `HELD_WINDOWS` windows."""
    return window > newest - HELD_WINDOWS


def windows_to_hold(
    topics: Iterable[str], pattern: re.Pattern[str], keep: Callable[[int, int], bool] = recent_windows
) -> list[str]:
    """The window topics among `topics` matching `pattern` that a reader holds:
    `keep(window, newest window)` says which."""
    found = {topic: topic_window(topic) for topic in topics if pattern.match(topic)}
    windows = {topic: window for topic, window in found.items() if window is not None}
    newest = max(windows.values(), default=0)
    return sorted(topic for topic, window in windows.items() if keep(window, newest))


def parse_topic(topic: str) -> tuple[str, str] | None:
    """(run_id, kind) of a StreamRL topic (plain or a window's), or None for any other topic."""
    match = _TOPIC_PATTERN.match(topic)
    if not match or match.group(2) not in KINDS:
        return None
    if match.group(3) is not None and match.group(2) not in ROTATED_KINDS:
        return None
    return match.group(1), match.group(2)


def all_runs_pattern() -> str:
    """Regex subscribing to every StreamRL topic of every run (windows included)."""
    return rf"^{TOPIC_PREFIX}\..+\.({'|'.join(KINDS)})(\.w\d+)?$"


def run_pattern(run_id: str, kinds: Iterable[str] = KINDS) -> str:
    """Regex of the run's topics of `kinds`, windows included."""
    return rf"^{TOPIC_PREFIX}\.{re.escape(validate_run_id(run_id))}\.({'|'.join(kinds)})(\.w\d+)?$"


def existing_run_topics(run_id: str, listed: Iterable[str]) -> list[str]:
    """The run's topics among those the broker lists: plain ones and windows."""
    pattern = re.compile(run_pattern(run_id))
    return sorted(topic for topic in listed if pattern.match(topic))


def existing_run_windows(run_id: str, listed: Iterable[str]) -> set[int]:
    """The run's windows among the topics the broker lists."""
    return {window for topic in existing_run_topics(run_id, listed) if (window := topic_window(topic)) is not None}


def event_key(event: Event) -> bytes:
    """Partition key: a whole GRPO group shares a partition; run-level events by run id."""
    group_id = getattr(event, "group_id", None)
    return str(group_id or event.run_id).encode()
