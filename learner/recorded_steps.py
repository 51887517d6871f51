"""Snapshot + replay: what a restarted learner re-trains after its newest snapshot.

The learner writes a snapshot (model, optimizer, RNG, offsets) every `trainer.save_freq`
steps, not every step: for a 7B model a snapshot is tens of GB. Every step's TrainStep
is published, though, with the ids of the samples it trained and dropped. So the state
after step k is the snapshot of step s <= k plus steps s+1..k re-trained on exactly
their recorded samples, in their recorded order, at their recorded learning rate. The
samples come again from the samples topic, from the snapshot's offsets.

The recorded steps are read from the ledger and from the steps topic. The topic can be
ahead of the ledger by the sink's lag. The ledger still has them after the broker lost
its topics. The learner's earlier resumes are read the same way, from the ledger and the
runs topic: each resume is numbered, so that two resumes to the same step are two events.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from streamrl.learner.batching import TrainItem
from streamrl.runtime.bus import RunReader
from streamrl.runtime.db import connect
from streamrl.runtime.outage import PostgresOutage
from streamrl.runtime.settings import Settings
from streamrl.schema.events import RunEvent, TrainStep
from streamrl.schema.ledger import query_events

# Empty polls in a row that end the read of the steps and runs topics (the embedded broker
# does not answer a partition's true end offset, so the end is where records stop coming).
QUIET_POLLS = 3


class ReplayMismatch(RuntimeError):
    """A recorded step's samples are not the ones the samples topic holds for it."""


def holds_untrained(window_steps: int | None, window: int, trained: int) -> bool:
    """Whether a window of `window_steps` steps holds a step after `trained`."""
    return window_steps is None or (window + 1) * window_steps - 1 > trained


@dataclass(frozen=True)
class Recorded:
    """What a restarted learner finds recorded of its run's earlier lives."""

    steps: dict[int, TrainStep]  # step -> its TrainStep, for the steps after the snapshot, without a gap
    resumes: int  # the highest number a `resumed` run event carries (0: never resumed)

    @property
    def next_resume(self) -> int:
        """The number this life carries if it is a resume."""
        return self.resumes + 1

    def reached(self, snapshot_step: int) -> int:
        """The step the learner is at once it has re-trained the recorded steps."""
        return max(self.steps, default=snapshot_step)


def recorded_steps(settings: Settings, run_id: str, after: int, window_steps: int | None = None) -> Recorded:
    """Every step the learner published after step `after`, and its resumes so far."""
    outage = PostgresOutage(settings, run_id)  # a restart may meet the ledger restarting too
    while True:
        try:
            with connect(settings.database_url, autocommit=True) as conn:
                found = {
                    record.step: record
                    for record in query_events(
                        conn, TrainStep, "select * from train_steps where run_id = %s and step > %s", (run_id, after)
                    )
                }
                query = "select coalesce(max(sequence), 0) from run_events where run_id = %s and kind = 'resumed'"
                (resumes,) = conn.execute(query, (run_id,)).fetchone() or (0,)
            break
        except psycopg.OperationalError as exc:
            outage.wait(exc)
    reader = RunReader(
        settings,
        run_id,
        ["steps", "runs"],
        group_id=None,
        stage="learner",
        wait_s=10.0,
        keep_window=lambda window, newest: holds_untrained(window_steps, window, after),
    )
    try:
        quiet = 0
        while quiet < QUIET_POLLS:
            events, _ = reader.poll(timeout_ms=300)
            quiet = 0 if events else quiet + 1
            for event, _, _ in events:
                if isinstance(event, TrainStep) and event.step > after:
                    found.setdefault(event.step, event)
                elif isinstance(event, RunEvent) and event.kind == "resumed":
                    resumes = max(resumes, event.sequence)
    finally:
        reader.close()
    # Steps are published in order, so the recorded ones run on from `after` without a
    # gap; a later one after a gap could only come from a different learner history.
    contiguous, step = {}, after + 1
    while step in found:
        contiguous[step] = found[step]
        step += 1
    return Recorded(contiguous, resumes)


def resumed_event(run_id: str, recorded: Recorded, snapshot_step: int) -> RunEvent:
    """A learner's `resumed` run event. Its sequence is the resume's number, not the step it
    resumed after: two resumes can reach the same step (the learner killed again before it
    trained further), and an event's id is its kind and sequence."""
    after_step, number = recorded.reached(snapshot_step), recorded.next_resume
    return RunEvent(
        run_id=run_id,
        kind="resumed",
        sequence=number,
        name="learner",
        message=f"resume {number}: after step {after_step}, snapshot of step {snapshot_step}, "
        f"{len(recorded.steps)} recorded steps to re-train",
        details={"after_step": after_step, "snapshot_step": snapshot_step, "replayed_steps": len(recorded.steps)},
    )


def exactly_recorded(items: list[TrainItem], record: TrainStep) -> tuple[list[TrainItem], list[TrainItem]]:
    """The items the recorded step trained (in its order) and those it dropped as stale."""
    by_id = {item.trajectory_id: item for item in items}
    missing = [i for i in [*record.sample_ids, *record.dropped_ids] if i not in by_id]
    if missing:
        raise ReplayMismatch(
            f"step {record.step} was recorded with samples the samples topic does not hold for it "
            f"({len(missing)}, e.g. {missing[0]}): it cannot be re-trained exactly"
        )
    return [by_id[i] for i in record.sample_ids], [by_id[i] for i in record.dropped_ids]
