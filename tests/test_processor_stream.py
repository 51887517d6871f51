"""The stream processor as a process sees it, on the real broker: a group that timed out
before all its members arrived records the latecomers (`late`), so the ledger accounts
for every trajectory, and a second copy of a member is not recorded twice."""

from __future__ import annotations

import threading
import time

import msgspec

from streamrl.consumers.processor import StreamProcessor
from streamrl.runtime.bus import EventPublisher, RunReader
from streamrl.runtime.config import Recipe
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema.events import GroupFiltered
from tests.test_processor import member


def test_latecomers_of_a_timed_out_group_are_recorded_once(stack, run_id):
    create_run_topics(stack, run_id)
    recipe = Recipe()
    recipe.trajectory_pool.group_timeout_s = 1.0
    processor = StreamProcessor(stack, run_id, recipe)
    (t0, e0), (t1, e1), (t2, e2) = [member(i, float(i)) for i in range(3)]
    early = [t0, e0, t1]  # t1's evaluation is not there when the group times out
    late = [e1, t2, e2, t2]  # t2 comes twice (a re-run task)
    try:
        with EventPublisher(stack) as publisher:
            for event in early:
                publisher.publish(_in_run(event, run_id))
        deadline = time.monotonic() + 30
        while processor.stats.groups == 0 and time.monotonic() < deadline:
            processor.poll_once()
        with EventPublisher(stack) as publisher:
            for event in late:
                publisher.publish(_in_run(event, run_id))
        processor.run(threading.Event(), idle_exit_s=3)
    finally:
        processor.close()

    reader = RunReader(stack, run_id, ["samples"], group_id=None)
    records, deadline = [], time.monotonic() + 10
    while time.monotonic() < deadline and len(records) < 3:
        records += [event for event, _, _ in reader.poll(timeout_ms=500)[0]]
    reader.close()
    assert all(isinstance(r, GroupFiltered) for r in records)
    by_reason = sorted((r.reason, tuple(r.trajectory_ids)) for r in records)
    assert by_reason == [("late", ("g-1",)), ("late", ("g-2",)), ("timeout", ("g-0",))]
    assert len({r.event_id for r in records}) == 3
    assert sum(r.received for r in records) == 3  # every trajectory accounted for, once
    assert processor.stats.filtered == {"timeout": 1, "late": 2}


def _in_run(event, run_id):
    return msgspec.structs.replace(event, run_id=run_id, event_id="")
