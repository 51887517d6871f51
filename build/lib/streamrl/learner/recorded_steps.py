"""Snapshot + replay: what a restarted learner re-trains after its newest snapshot.

The learner writes a snapshot (model, optimizer, RNG, offsets) every `trainer.save_freq`
steps, not every step: for a 7B model a snapshot is tens of GB. Every step's TrainStep
is published, though, with the ids of the samples it trained and dropped. So the state
after step k is the snapshot of step s <= k plus steps s+1..k re-trained on exactly
their recorded samples, in their recorded order, at their recorded learning rate. The
samples come again from the samples topic, from the snapshot's offsets.

The recorded steps are read from the ledger and from the steps topic. The topic can be
ahead of the ledger by the sink's lag. The ledger still has them after the broker lost
its topics.
"""

from __future__ import annotations

import psycopg

from streamrl.learner.batching import TrainItem
from streamrl.runtime.bus import RunReader
from streamrl.runtime.db import connect
from streamrl.runtime.outage import PostgresOutage
from streamrl.runtime.settings import Settings
from streamrl.schema.events import TrainStep
from streamrl.schema.ledger import query_events

# Empty polls in a row that end the read of the steps topic (the embedded broker does not
# answer a partition's true end offset, so the end is where records stop coming).
QUIET_POLLS = 3


class ReplayMismatch(RuntimeError):
    """A recorded step's samples are not the ones the samples topic holds for it."""


def holds_untrained(window_steps: int | None, window: int, trained: int) -> bool:
    """Whether a window of `window_steps` steps holds a step after `trained`."""
    return window_steps is None or (window + 1) * window_steps - 1 > trained


def recorded_steps(settings: Settings, run_id: str, after: int, window_steps: int | None = None) -> dict[int, TrainStep]:
    """step -> the TrainStep the learner published for it, for every step after `after`."""
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
            break
        except psycopg.OperationalError as exc:
            outage.wait(exc)
    reader = RunReader(
        settings,
        run_id,
        ["steps"],
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
    finally:
        reader.close()
    # Steps are published in order, so the recorded ones run on from `after` without a
    # gap; a later one after a gap could only come from a different learner history.
    contiguous, step = {}, after + 1
    while step in found:
        contiguous[step] = found[step]
        step += 1
    return contiguous


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
