"""The task publisher: creates the run and feeds it tasks, paced by weight versions.

Step s (1-based) trains on the tasks published for step s: `trajectory_pool.batch_size`
prompts, each repeated `rollout_repeat_n` times (one group). Tasks for step s go out
once weight version s - 1 - k exists, where k is 0 in sync mode (on-policy: the tasks
of step s are sampled by the weights of step s - 1) and `weight.staleness_threshold`
otherwise; so at most k + 1 steps of tasks are in flight, and no sample can be more
than k versions behind the learner unless a worker lags (the learner drops those).

Validation tasks (every held-out row once, `is_val`) go out for weight version 0 when
`validate_before_train`, every `validate.eval.compute_interval` versions, and for the
final version.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from streamrl.runtime.bus import EventPublisher, RunReader
from streamrl.runtime.config import Recipe
from streamrl.runtime.dataset import epoch_batches, lookup, saved_chat_template, training_rows, validation_rows
from streamrl.runtime.service_config import with_resolved_windows
from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.runtime.topic_retention import topic_configs
from streamrl.runtime.versions import newest_version
from streamrl.runtime.weight_trust import VersionRules, VersionSequence, WeightVersionRefused
from streamrl.schema.events import RunEvent, Task, WeightVersion
from streamrl.schema.topics import set_window_steps

log = logging.getLogger("streamrl.publisher")


@dataclass
class Pacing:
    total_steps: int
    staleness: int  # k: tasks of step s need a version at most k published versions behind the learner's
    sync_every: int = 1  # a version every this many steps

    def min_version(self, step: int) -> int:
        """The oldest version step s's tasks may be sampled by: the learner, about to train
        step s, has published newest_version(s - 1); k versions before it."""
        return max(0, newest_version(step - 1, self.sync_every) - self.staleness * self.sync_every)


def pacing_for(recipe: Recipe, rows: int) -> Pacing:
    weight = recipe.weight
    k = 0 if weight.sync_mode == "sync" else weight.staleness_threshold
    return Pacing(recipe.total_train_steps(rows), k, weight.sync_every)


def validation_versions(recipe: Recipe, total_steps: int) -> list[int]:
    validate = recipe.validate
    if not validate.data.data_files:
        return []
    every = max(1, validate.eval.compute_interval) * recipe.weight.sync_every  # in published versions
    versions = set(range(every, total_steps + 1, every)) | {total_steps}
    if validate.validate_before_train:
        versions.add(0)
    return sorted(versions)


def step_tasks(run_id: str, step: int, rows: list[dict], group_size: int, prompt_key: str, min_weight_version: int) -> list[Task]:
    tasks = []
    for g, row in enumerate(rows):
        group_id = f"s{step:06d}-g{g:04d}"
        for i in range(group_size):
            tasks.append(
                Task(
                    run_id=run_id,
                    task_id=f"{group_id}-{i}",
                    group_id=group_id,
                    sample_index=i,
                    group_size=group_size,
                    prompt=lookup(row, prompt_key),
                    data=row,
                    step=step,
                    min_weight_version=min_weight_version,
                )
            )
    return tasks


def validation_tasks(run_id: str, version: int, rows: list[dict], prompt_key: str) -> list[Task]:
    return [
        Task(
            run_id=run_id,
            task_id=f"val{version:06d}-{i:05d}",
            group_id=f"val{version:06d}-{i:05d}",
            group_size=1,
            prompt=lookup(row, prompt_key),
            data=row,
            is_val=True,
            step=version,
            min_weight_version=version,
        )
        for i, row in enumerate(rows)
    ]


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def create_run(
    settings: Settings,
    run_id: str,
    recipe: Recipe,
    publisher: EventPublisher,
    parent_run_id: str | None = None,
    tag: str | None = None,
) -> Recipe:
    """Make the run's topics and publish its `created` event; returns the recipe as the
    run records it (`window_steps: auto` resolved), which the caller goes on with."""
    recipe = with_resolved_windows(recipe, settings.embedded_kafka, settings.partition_assignment)
    create_run_topics(settings, run_id, configs=topic_configs(recipe.service.broker, settings))
    set_window_steps(run_id, recipe.service.broker.resolved_windows())  # a replay publishes the new run's rollouts next
    config = recipe.to_dict()
    if recipe.data.apply_chat_template is not False and not recipe.data.chat_template:
        # the template the run renders with, as the model folder holds it now
        config["data"]["chat_template"] = saved_chat_template(recipe.rollout_worker.model_path)
    publisher.publish(
        RunEvent(
            run_id=run_id,
            kind="created",
            name=recipe.experiment_name,
            config=config,
            parent_run_id=parent_run_id,
            # how its workers and processors share partitions: one that joins later is
            # checked against it (runtime/runs.py)
            details={
                "git_sha": git_sha(),
                "partition_assignment": settings.partition_assignment,
                **({"tag": tag} if tag else {}),
            },
        )
    )
    publisher.flush()
    return recipe


def run_publisher(
    settings: Settings,
    run_id: str,
    recipe: Recipe,
    stop: threading.Event | None = None,
    on_progress=None,
    skip_task_ids: set[str] | None = None,
) -> int:
    """Publish every task of the run (but those in `skip_task_ids`: a resumed run's
    finished ones); returns the number of training steps published."""
    skip = skip_task_ids or set()
    stop = stop or threading.Event()
    set_window_steps(run_id, recipe.service.broker.resolved_windows())
    data = recipe.data
    rows = training_rows(data, prompt_keys=(data.prompt_key,))
    val_cfg = recipe.validate.data
    val_rows = validation_rows(val_cfg.data_files, val_cfg.type, val_cfg.max_rows, prompt_keys=(val_cfg.prompt_key,))
    pacing = pacing_for(recipe, len(rows))
    val_versions = validation_versions(recipe, pacing.total_steps) if val_rows else []
    batches = epoch_batches(rows, recipe.trajectory_pool.batch_size, data.shuffle, data.seed)
    group_size = recipe.rollout_worker.rollout_repeat_n

    weights = RunReader(settings, run_id, ["weights"], group_id=None, stage="publisher")
    # a group's tasks leave as one record; a new topic window waits for the ledger sink (paced)
    publisher = EventPublisher(settings, bundle=True, stage="publisher", paced=True)
    # versions that cannot be the learner's are passed over (the workers dead-letter them)
    versions = VersionSequence(VersionRules.of(settings.home, run_id, recipe, pacing.total_steps))
    latest = -1
    next_step = 1
    try:
        while not stop.is_set():
            events, _ = weights.poll(timeout_ms=100)
            for event in (e for e, _, _ in events if isinstance(e, WeightVersion)):
                try:
                    versions.offer(event)
                except WeightVersionRefused as exc:  # the workers and the ledger sink dead-letter it
                    log.warning("passed over: %s", exc)
            latest = versions.accepted.version if versions.accepted is not None else -1
            while val_versions and latest >= val_versions[0]:
                version = val_versions.pop(0)
                for task in validation_tasks(run_id, version, val_rows, val_cfg.prompt_key):
                    if task.task_id not in skip:
                        publisher.publish(task)
            while next_step <= pacing.total_steps and latest >= pacing.min_version(next_step):
                _, batch = next(batches)
                for task in step_tasks(run_id, next_step, batch, group_size, data.prompt_key, pacing.min_version(next_step)):
                    if task.task_id not in skip:
                        publisher.publish(task)
                next_step += 1
            publisher.flush()
            if on_progress:
                on_progress(next_step - 1, latest)
            if next_step > pacing.total_steps and not val_versions:
                break
    finally:
        publisher.close()
        weights.close()
    return next_step - 1
