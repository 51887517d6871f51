"""`streamrl tracker RUN`: the run's train steps and validation results, from its
topics, into the experiment trackers the recipe names (`logger.backends`).

A consumer like any other: the learner never waits for it, so a tracker that is slow or
unreachable costs the run nothing, and one started late (or restarted) catches up from
its committed offsets. `streamrl export RUN --to ...` sends the same metrics from the
ledger instead, for a run that had no tracker or lost one.

What becomes a metric is decided by two pure functions (`train_step_metrics`,
`validation_metrics`) that the feed and the export share, so both log the same numbers.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from statistics import fmean

from kafka import TopicPartition

from streamrl.consumers.tracker_backends import STEP_AXIS, VERSION_AXIS, Tracker, open_trackers
from streamrl.runtime.bus import RunReader
from streamrl.runtime.config import Recipe
from streamrl.runtime.dataset import read_rows
from streamrl.runtime.settings import Settings
from streamrl.schema.events import Evaluation, TrainStep

log = logging.getLogger("streamrl.tracker")
TRACKER_GROUP = "streamrl-tracker"


def train_step_metrics(step: TrainStep) -> dict[str, float]:
    """A train step as `train/<name>` numbers (the learner's own metrics included; names
    that carry a namespace keep it)."""
    metrics = {
        "loss": step.loss,
        "clip_fraction": step.clip_fraction,
        "grad_norm": step.grad_norm,
        "lr": step.lr,
        "tokens": step.tokens,
        "samples": step.samples,
        "seconds": step.seconds,
        "weight_version": step.weight_version,
        "dropped": len(step.dropped_ids),
    }
    if step.kl is not None:
        metrics["kl"] = step.kl
    if step.entropy is not None:
        metrics["entropy"] = step.entropy
    if step.seconds > 0:
        metrics["tokens_per_s"] = step.tokens / step.seconds
    metrics.update({f"staleness_{key}": value for key, value in step.staleness.items()})
    metrics.update(step.metrics)
    # a name with its own namespace (verl's response_length/mean, critic/score/mean,
    # timing_s/step; the guide's rollout/*) is logged as it is, so a verl user's dashboards apply
    return {(key if "/" in key else f"train/{key}"): float(value) for key, value in metrics.items()}


def validation_metrics(evaluations: list[Evaluation]) -> dict[str, float]:
    """A weight version's validation: accuracy is the evaluator's `accuracy` metric where
    it reports one (shaped rewards), else the reward, as in `streamrl report`."""
    return {
        "val/accuracy": fmean(e.metrics.get("accuracy", e.reward) for e in evaluations),
        "val/reward_mean": fmean(e.reward for e in evaluations),
        "val/count": float(len(evaluations)),
    }


def validation_size(recipe: Recipe) -> int:
    """How many evaluations complete one version's validation: the held-out rows."""
    data = recipe.validate.data
    if not data.data_files:
        return 0
    rows = len(read_rows(data.data_files, data.type))
    return min(rows, data.max_rows) if data.max_rows else rows


class TrackerFeed:
    def __init__(self, settings: Settings, run_id: str, recipe: Recipe, trackers: list[Tracker] | None = None):
        self.run_id = run_id
        self.trackers = trackers if trackers is not None else open_trackers(settings, run_id, recipe.to_dict(), recipe.logger)
        self.val_size = validation_size(recipe)
        # a validation is logged once all its evaluations are in; until then its events'
        # offsets stay uncommitted, so a restarted feed reads them again
        self.open_validations: dict[int, dict[str, tuple[Evaluation, TopicPartition, int]]] = defaultdict(dict)
        self.reader = RunReader(settings, run_id, ["steps", "evaluations"], group_id=f"{TRACKER_GROUP}.{run_id}", stage="tracker")
        self.logged_steps = 0
        self.logged_validations = 0

    def log(self, metrics: dict[str, float], axis: str, value: int) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, axis, value)

    def poll_once(self, timeout_ms: int = 200) -> int:
        events, dead = self.reader.poll(timeout_ms=timeout_ms, max_records=2000)
        if dead:  # the ledger sink reads the same records and keeps them as dead letters
            log.warning("tracker: %d undecodable records skipped (see the run's dead letters)", len(dead))
        for event, tp, offset in events:
            if isinstance(event, TrainStep):
                self.log(train_step_metrics(event), STEP_AXIS, event.step)
                self.logged_steps += 1
            elif isinstance(event, Evaluation) and event.is_val:
                self.open_validations[event.step][event.trajectory_id] = (event, tp, offset)
        for version in sorted(self.open_validations):
            if self.val_size and len(self.open_validations[version]) >= self.val_size:
                evaluations = [e for e, _, _ in self.open_validations.pop(version).values()]
                self.log(validation_metrics(evaluations), VERSION_AXIS, version)
                self.logged_validations += 1
        if events or dead:
            pending = [(tp, offset) for entries in self.open_validations.values() for _, tp, offset in entries.values()]
            self.reader.commit(self.reader.first_needed_offsets(pending))
        return len(events) + len(dead)

    def run(self, stop: threading.Event) -> None:
        """Until stopped; then what the topics already hold is logged before closing."""
        while not stop.is_set():
            self.poll_once()
        while self.poll_once(timeout_ms=1000):
            pass

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.reader.close()


STEP_COLUMNS = (
    "step",
    "weight_version",
    "loss",
    "kl",
    "entropy",
    "clip_fraction",
    "grad_norm",
    "lr",
    "tokens",
    "samples",
    "dropped_ids",
    "staleness",
    "seconds",
    "metrics",
)


def export_from_ledger(database_url: str, run_id: str, trackers: list[Tracker]) -> tuple[int, int]:
    """Send a run's train steps and complete validations from the ledger to `trackers`,
    through the same metric functions as the live feed; returns (steps, validations)."""
    from streamrl.runtime.db import connect

    with connect(database_url, autocommit=True) as conn:
        steps = [
            TrainStep(run_id=run_id, **{k: v for k, v in zip(STEP_COLUMNS, row) if v is not None})
            for row in conn.execute(
                f"select {', '.join(STEP_COLUMNS)} from train_steps where run_id = %s order by step", (run_id,)
            )
        ]
        by_version: dict[int, list[Evaluation]] = defaultdict(list)
        for trajectory_id, group_id, step, reward, metrics in conn.execute(
            "select trajectory_id, group_id, step, reward, metrics from evaluations where run_id = %s and is_val order by step",
            (run_id,),
        ):
            by_version[step].append(
                Evaluation(
                    run_id=run_id,
                    trajectory_id=trajectory_id,
                    group_id=group_id,
                    reward=reward,
                    metrics=metrics or {},
                    is_val=True,
                    step=step,
                )
            )
    for step in steps:
        for tracker in trackers:
            tracker.log(train_step_metrics(step), STEP_AXIS, step.step)
    for version, evaluations in sorted(by_version.items()):
        for tracker in trackers:
            tracker.log(validation_metrics(evaluations), VERSION_AXIS, version)
    return len(steps), len(by_version)
