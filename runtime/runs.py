"""A run's resolved config, read back from its `runs` topic.

`streamrl publish` records the fully resolved recipe in the run's `created` event; every
other process of the run (workers, processor, learner) starts from that record, so all
of them run exactly the recorded config, wherever they were started from.
"""

from __future__ import annotations

import signal
import threading
import time

from streamrl.runtime.bus import RunReader
from streamrl.runtime.config import Recipe
from streamrl.runtime.settings import Settings
from streamrl.schema.events import RunEvent
from streamrl.schema.topics import set_window_steps


class RunNotFound(LookupError):
    pass


class AssignmentMismatch(RuntimeError):
    """A worker or processor that would share a run's partitions another way than the
    run's own processes: it would roll out (or group) what another already does."""


def assignment_problem(run_id: str, recorded: str | None, mine: str) -> str | None:
    if recorded is None or recorded == mine:  # a run created before the choice was recorded: not checked
        return None
    how = {"shard": "fixed shards (what `streamrl run` gives its processes)", "group": "consumer groups"}
    return (
        f"run {run_id!r} shares its partitions by {how.get(recorded, recorded)}, and this process would use "
        f"{how.get(mine, mine)}: set STREAMRL_PARTITION_ASSIGNMENT={recorded} to join it (a run that "
        f"workers join by hand is started with STREAMRL_PARTITION_ASSIGNMENT=group)"
    )


def fetch_run_config(settings: Settings, run_id: str, timeout_s: float = 60.0, check_assignment: bool = False) -> Recipe:
    """The run's recipe from its `created` event; with `check_assignment`, refused
    (AssignmentMismatch) when the run's processes share partitions another way."""
    reader = RunReader(settings, run_id, ["runs"], group_id=None, stage="config", wait_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            events, _ = reader.poll(timeout_ms=200)
            for event, _, _ in events:
                if isinstance(event, RunEvent) and event.kind == "created":
                    problem = assignment_problem(run_id, event.details.get("partition_assignment"), settings.partition_assignment)
                    if check_assignment and problem:
                        raise AssignmentMismatch(problem)
                    recipe = Recipe.recorded(event.config)
                    set_window_steps(run_id, recipe.service.broker.resolved_windows())  # where this process publishes
                    return recipe
    finally:
        reader.close()
    raise RunNotFound(
        f"run {run_id!r} has no 'created' event on its runs topic after {timeout_s:.0f} s "
        "(publish it first: streamrl publish RECIPE --run RUN)"
    )


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: loops finish what is in flight, commit, exit 0."""
    stop = threading.Event()

    def request_stop(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop
