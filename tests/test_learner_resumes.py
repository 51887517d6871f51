"""A learner's resume is numbered from the resumes the ledger and the runs topic hold, so
a second resume to the same step is a second event beside the first, not a repeat of the
first's id that the sink refuses (docs/decisions.md "A resume's identity")."""

from __future__ import annotations

from streamrl.consumers.ledger_writes import Placed, create_staging_tables, insert_events
from streamrl.learner.recorded_steps import Recorded, recorded_steps, resumed_event
from streamrl.producers.synthetic import synthetic_train_step
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema.topics import topic_name
from tests.conftest import SinkThread, count_rows, wait_for

RESUMED = "select sequence, details from run_events where run_id = %s and kind = 'resumed' order by sequence"


def test_two_resumes_to_the_same_step_are_two_events_in_the_ledger(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    assert recorded_steps(stack, run_id, after=0).resumes == 0  # a first start

    # Resume 1: killed after step 8, the learner came back from its snapshot of step 5 and
    # re-trained steps 6-8. Its event is in the ledger only (the broker lost its topics since).
    retrained = {step: synthetic_train_step(run_id, step) for step in (6, 7, 8)}
    first = resumed_event(run_id, Recorded(steps=retrained, resumes=0), snapshot_step=5)
    create_staging_tables(ledger)
    with ledger.transaction():
        assert insert_events(ledger, [Placed(first, topic_name(run_id, "runs"), -1, -1)]) == []

    # Resume 2: killed again before it trained past step 8, from its snapshot of step 8.
    recorded = recorded_steps(stack, run_id, after=8)
    assert recorded == Recorded(steps={}, resumes=1)  # counted from the ledger
    second = resumed_event(run_id, recorded, snapshot_step=8)
    assert (second.sequence, second.details["after_step"]) == (2, first.details["after_step"])
    assert second.event_id != first.event_id
    with EventPublisher(stack, stage="learner") as publisher:
        publisher.publish(second)
    assert recorded_steps(stack, run_id, after=8).resumes == 2  # counted from the topic, the sink behind

    with SinkThread(stack, run_id):
        wait_for(lambda: len(ledger.execute(RESUMED, (run_id,)).fetchall()) == 2, 60, what="the second resume in the ledger")
    assert ledger.execute(RESUMED, (run_id,)).fetchall() == [
        (1, {"after_step": 8, "snapshot_step": 5, "replayed_steps": 3}),
        (2, {"after_step": 8, "snapshot_step": 8, "replayed_steps": 0}),
    ]
    assert count_rows(ledger, "dead_letters", run_id) == 0
