"""The rollout worker process: tasks in, trajectories and evaluations out.

A thin loop around a `BaseRolloutWorker`: take up to `max_concurrent_tasks` tasks from
this worker's partitions, make sure the engine holds a weight version the tasks allow,
roll them out concurrently (the engine batches their completions), publish, and only
then commit the tasks' offsets. In sync and batch-async mode the tasks are taken a batch
at a time; in fully-async mode as room frees (a record at a time, committed below the
oldest one still rolling out). A crash re-runs the uncommitted tasks; their events keep
the same ids, and the processor and ledger keep the first copy.

Weight sync (`weight.sync_mode`):
    sync         tasks carry min_weight_version = the version they must be sampled by;
                 the worker waits for it and loads it between batches of tasks
    batch-async  the newest version is loaded between batches of tasks
    fully-async  the newest version is loaded as soon as it arrives, between two
                 engine batches (a watcher thread), even while tasks are in flight

With `weight.transport: distributed` every version is received as the learner
broadcasts it (the watcher thread, in sync mode too): a broadcast waits for every server.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from pathlib import Path

from kafka import TopicPartition

import streamrl.producers.agent_worker  # registers the "agent" worker type
import streamrl.producers.modelled_engine  # registers the "modelled" inference backend (the cluster twin's)
import streamrl.producers.openai_engine  # registers the "openai" inference backend
import streamrl.producers.sglang_engine  # noqa: F401  (registers the "sglang" inference backend)
from streamrl.producers.evaluator import Evaluator
from streamrl.producers.evaluator_builtins import make_evaluator as build_evaluator
from streamrl.producers.inference import INFERENCE_BACKENDS, SamplingParams
from streamrl.producers.rollout import ROLLOUT_WORKERS, BaseRolloutWorker, InferenceClient, make_worker
from streamrl.producers.weight_watcher import WeightWatcher
from streamrl.runtime.bus import EventPublisher, RunReader
from streamrl.runtime.chat_template import recipe_renderer
from streamrl.runtime.config import Recipe
from streamrl.runtime.config_reads import unread_keys
from streamrl.runtime.folders import run_logs
from streamrl.runtime.gpu_model import twin_from_env
from streamrl.runtime.plugins import load_class
from streamrl.runtime.settings import Settings
from streamrl.runtime.weight_trust import VersionRules, WeightVersionRefused, check_folder, known_total_steps
from streamrl.schema.events import RunEvent, Task, WeightVersion
from streamrl.schema.topics import event_key

log = logging.getLogger("streamrl.worker")
WORKER_GROUP = "streamrl-worker"
# Rollouts after which a custom worker's own keys it never read are reported (once).
UNREAD_CHECK_ROLLOUTS = 16


def make_evaluator(recipe: Recipe) -> Evaluator:
    worker = recipe.rollout_worker
    return build_evaluator(worker.evaluator_module_path, worker.evaluator_kwargs, answer_key=recipe.data.answer_key)


def worker_class(recipe: Recipe) -> type[BaseRolloutWorker]:
    worker = recipe.rollout_worker
    if worker.custom_rollout_worker_module_path:
        spec = worker.custom_rollout_worker_module_path  # file.py:Class, or the file and the class apart
        if worker.custom_rollout_worker_class_name:
            spec = f"{spec}:{worker.custom_rollout_worker_class_name}"
        return load_class(spec, ".", BaseRolloutWorker)
    try:
        return ROLLOUT_WORKERS.get(worker.type)
    except KeyError as exc:
        raise ValueError(f"rollout_worker.type: {exc} (or set custom_rollout_worker_module_path)") from None


def run_worker(
    settings: Settings,
    run_id: str,
    recipe: Recipe,
    shard: tuple[int, int] = (0, 1),
    stop: threading.Event | None = None,
    idle_exit_s: float | None = None,
    name: str | None = None,
) -> int:
    """Serve tasks until stopped; returns the number of tasks completed.

    With `STREAMRL_PARTITION_ASSIGNMENT=group` (the default) the worker joins the run's
    worker group as `name` and serves the tasks partitions the group gives it; with
    `shard` it serves the partitions of `shard`."""
    return WorkerLoop(settings, run_id, recipe, shard, stop or threading.Event(), name).run(idle_exit_s)


class WorkerLoop:
    """One worker process: its engine, its reader of tasks, its publisher, and the weight
    version its engine holds."""

    def __init__(
        self, settings: Settings, run_id: str, recipe: Recipe, shard: tuple[int, int], stop: threading.Event, name: str | None
    ):
        self.settings, self.run_id, self.stop = settings, run_id, stop
        self.cfg, self.mode = recipe.rollout_worker, recipe.weight.sync_mode
        self.transport = recipe.weight.transport
        in_group = settings.partition_assignment == "group"
        name = name or (os.uname().nodename if in_group else str(shard[0]))
        worker_id = f"{os.uname().nodename}-{os.getpid()}-{name}"
        # each worker samples with its own seed: the shard index, or a number from its name
        seed_offset = zlib.crc32(name.encode()) % 1000 if in_group else shard[0]
        # under the cluster twin (bench/cluster_twin.py) the GPUs are modelled, whatever the recipe says
        backend = INFERENCE_BACKENDS.get("modelled" if twin_from_env() else recipe.service.inference_service.backend)
        self.engine = backend(recipe, recipe.trainer.seed + seed_offset, settings, run_logs(settings.home, run_id))
        cfg = self.cfg
        client = InferenceClient(
            self.engine,
            SamplingParams(max_new_tokens=cfg.max_response_length, temperature=cfg.temperature, top_p=cfg.top_p),
            SamplingParams(max_new_tokens=cfg.max_response_length, temperature=recipe.validate.temperature),
            max_prompt_tokens=min(cfg.max_prompt_length, recipe.data.max_prompt_length),
            chat=recipe_renderer(recipe, self.engine.tokenizer),
            run_seed=recipe.trainer.seed,
        )
        # a group's trajectories (and its evaluations) leave as one record each
        self.publisher = EventPublisher(settings, bundle=True, stage="worker")
        self.worker = make_worker(
            worker_class(recipe), cfg.worker_config(), client, make_evaluator(recipe), self.publisher.publish, worker_id
        )
        self.tasks = RunReader(
            settings,
            run_id,
            ["tasks"],
            group_id=f"{WORKER_GROUP}.{run_id}",
            shard=shard,
            stage="worker",
            member=name if in_group else None,
        )
        self.version_rules = VersionRules.of(settings.home, run_id, recipe, known_total_steps(recipe))
        self.watcher = WeightWatcher(settings, run_id, self.version_rules)
        self.followers: list[WeightWatcher] = [self.watcher]
        self.loaded_version = -1
        self._load_lock = threading.Lock()
        self.failures: list[BaseException] = []
        self.pool = ThreadPoolExecutor(max_workers=cfg.max_concurrent_tasks, thread_name_prefix="rollout")
        self.undone = 0  # fully-async: rollouts taken and not yet done (a group's done ones free their room)
        self._room_lock = threading.Lock()
        self.unread_reported = False
        self.done = 0  # tasks rolled out

    def load(self, version: WeightVersion | None, watcher: WeightWatcher) -> None:
        """Load `version` into the engine if it is newer (applied before its next batch),
        once its folder holds what it announced (or refuse it: `watcher` dead-letters it)."""
        with self._load_lock:
            if version is not None and version.version > self.loaded_version:
                try:
                    check_folder(version)
                except WeightVersionRefused as exc:
                    log.error("%s", exc)
                    watcher.refuse(version, str(exc))
                    return
                if version.broadcast is not None:  # weight.transport distributed (an SGLang engine)
                    self.engine.update_weights(Path(version.uri), version.version, broadcast=version.broadcast)
                else:
                    self.engine.update_weights(Path(version.uri), version.version)
                self.loaded_version = version.version
                watcher.loaded(version.version)

    def _follow_weights(self, watcher: WeightWatcher) -> None:
        """fully-async, or weights broadcast: load each version as it arrives, from a
        thread of its own."""
        try:
            while not self.stop.is_set():
                self.load(watcher.poll(timeout_ms=200), watcher)
        except Exception as exc:  # a weight version the engine refused: the worker stops, loudly
            self.failures.append(exc)
            self.stop.set()

    def run(self, idle_exit_s: float | None) -> int:
        # a broadcast version is received as it is sent, whatever the worker is doing
        if self.mode == "fully-async" or self.transport == "distributed":
            follower = WeightWatcher(self.settings, self.run_id, self.version_rules)
            self.followers.append(follower)
            threading.Thread(target=self._follow_weights, args=(follower,), name="weights", daemon=True).start()
        try:
            if self.mode == "fully-async":
                self._take_as_room_frees(idle_exit_s)
            else:
                self._take_in_batches(idle_exit_s)
        finally:
            if self.done and not self.unread_reported:
                self.report_unread_keys()
            self.close()
        if self.failures:
            raise self.failures[0]
        return self.done

    def _take_in_batches(self, idle_exit_s: float | None) -> None:
        """sync and batch-async: a batch of tasks, rolled out, published, committed; then
        the next (a version is loaded between batches)."""
        last_work = time.monotonic()
        while not self.stop.is_set():
            events, dead = take_tasks(self.tasks, self.cfg.max_concurrent_tasks, self.cfg.rollout_repeat_n)
            letters = dead + [d for w in self.followers for d in w.take_refused()]
            for letter in letters:
                self.publisher.publish(letter)
            batch = [task for task, _, _ in events if isinstance(task, Task)]
            if not batch and not dead:
                if letters:  # refused weight versions, while no task comes
                    self.publisher.flush()
                if idle_exit_s is not None and time.monotonic() - last_work > idle_exit_s:
                    break
                continue
            last_work = time.monotonic()
            if batch:
                if not self._weights_for(batch):  # stopped while waiting: hand the tasks back uncommitted
                    break
                self._roll_out(batch)
                self._rolled_out(len(batch))
            self.publisher.flush()
            self._commit(events, dead)

    def _take_as_room_frees(self, idle_exit_s: float | None) -> None:
        """fully-async: tasks are taken as room frees, not a batch at a time. Each record
        taken (a group's tasks) is rolled out on a thread of its own; as each finishes, its
        events are published and the offsets below the oldest record still rolling out are
        committed. So a long answer holds only its own group, never the worker's next tasks."""
        rolling: dict[Future, tuple[TopicPartition, int, int]] = {}  # a record's rollout -> its coordinates, its tasks
        unfinished: list[tuple[TopicPartition, int]] = []  # records taken that will not finish here: never committed
        records = ThreadPoolExecutor(max_workers=self.cfg.max_concurrent_tasks, thread_name_prefix="record")
        last_work = time.monotonic()
        try:
            while rolling or not self.stop.is_set():
                if self._admit(rolling, unfinished, records):
                    last_work = time.monotonic()
                if not rolling:
                    if idle_exit_s is not None and time.monotonic() - last_work > idle_exit_s:
                        break
                    continue
                finished, _ = wait(rolling, timeout=0.05, return_when=FIRST_COMPLETED)
                for future in finished:
                    tp, offset, tasks = rolling.pop(future)
                    if future.exception() is not None:  # rolled out again after a restart; the worker stops, loudly
                        unfinished.append((tp, offset))
                        self.failures.append(future.exception())  # type: ignore[arg-type]  # not None here
                        self.stop.set()
                    else:
                        self._rolled_out(tasks)
                if finished:
                    last_work = time.monotonic()
                    self._commit_below(rolling, unfinished)
        finally:
            records.shutdown(wait=True)

    def _admit(self, rolling: dict, unfinished: list, records: ThreadPoolExecutor) -> bool:
        """Take what fits in the room left (a whole group, or anything when nothing is
        rolling) and start each record; True when anything was taken."""
        limit, group_size = self.cfg.max_concurrent_tasks, self.cfg.rollout_repeat_n
        room = limit - self.undone
        if self.stop.is_set() or (room < group_size and rolling):
            return False
        events, dead = take_tasks(self.tasks, room, group_size, timeout_ms=0 if rolling else 100)
        self._send_now(dead + [d for w in self.followers for d in w.take_refused()])
        for (tp, offset), batch in by_record(events).items():
            if self.stop.is_set() or not self._weights_for(batch):  # stopped while waiting
                unfinished.append((tp, offset))
            else:
                with self._room_lock:
                    self.undone += len(batch)
                rolling[records.submit(self._roll_out, batch, True)] = (tp, offset, len(batch))
        if dead:
            self._commit_below(rolling, unfinished)
        return bool(events or dead)

    def _rolled_out(self, tasks: int) -> None:
        self.done += tasks
        if not self.unread_reported and self.done >= UNREAD_CHECK_ROLLOUTS:
            self.report_unread_keys()

    def _commit_below(self, rolling: dict[Future, tuple[TopicPartition, int, int]], unfinished: list) -> None:
        """Once what finished is published: every partition's offset up to its oldest
        record not yet done (those after it are rolled out again after a crash, and keep
        their events' ids, so the first copy wins)."""
        self.publisher.flush(held=False)
        pending = [(tp, offset) for tp, offset, _ in rolling.values()] + unfinished
        self.tasks.commit(self.tasks.first_needed_offsets(pending))

    def _send_now(self, events: list) -> None:
        """Dead letters and refused versions, sent at once (not held with a group's events)."""
        for event in events:
            self.publisher.publish(event)
            self.publisher.send_held(event_key(event))

    def report_unread_keys(self) -> None:
        """Once, after the first rollouts: the worker's own keys it never read
        (runtime/config_reads.py), in its log and in the ledger."""
        self.unread_reported = True
        unread = unread_keys(self.worker._config, self.cfg.extra)
        if not unread:
            return
        message = (
            f"rollout_worker: {', '.join(unread)} read by nothing in the first rollouts of "
            f"{type(self.worker).__name__} (a misspelt key?); declare the worker's keys with "
            f"`config_keys = (...)` to have the others refused when the recipe is checked"
        )
        log.warning(message)
        unread_event = RunEvent(
            run_id=self.run_id,
            kind="config_unread",
            name="rollout_worker",
            message=message,
            details={"section": "rollout_worker", "keys": unread},
        )
        self._send_now([unread_event])
        self.publisher.flush(held=False)

    def _weights_for(self, batch: list[Task]) -> bool:
        """The engine holds a version every task of `batch` allows (sync waits for it;
        batch-async takes the newest between batches). False: stopped while waiting."""
        needed = max(task.min_weight_version for task in batch)
        if self.loaded_version >= needed:
            if self.mode != "fully-async":
                self.load(self.watcher.poll(), self.watcher)
            return True
        while self.loaded_version < needed:  # a version refused at loading: the learner's own comes later
            latest = self.watcher.wait_for(needed, self.stop)
            if latest is None:
                return False
            self.load(latest, self.watcher)
        return True

    def _roll_out(self, batch: list[Task], counted: bool = False) -> None:
        """What the worker samples as one batch it rolls out here, the rest a thread each;
        a group's events leave as soon as its last task here is done, not with the batch.
        `counted` (fully-async): each task done frees its room in `undone` at once, so a
        group's long answer holds one slot, not its whole group's."""
        unfinished = Counter(task.group_id for task in batch)
        finished_ids: set[int] = set()

        def finished(task: Task) -> None:
            finished_ids.add(id(task))
            unfinished[task.group_id] -= 1
            if not unfinished[task.group_id]:
                self.publisher.send_held(task.group_id.encode())
            if counted:
                with self._room_lock:
                    self.undone -= 1

        left = self.worker.run_tasks(batch, self.cfg.max_retries, finished)
        left_ids = {id(task) for task, _ in left}
        for task in batch:  # a worker's own run_tasks may not call `finished`
            if id(task) not in left_ids and id(task) not in finished_ids:
                finished(task)
        futures = {self.pool.submit(self.worker.run_task, task, retries): task for task, retries in left}
        for future in as_completed(futures):
            future.result()
            finished(futures[future])

    def _commit(self, events: list, dead: list) -> None:
        """After the batch's events are published: the offsets past every record taken."""
        next_offsets: dict[TopicPartition, int] = {}
        for _, tp, offset in events:
            next_offsets[tp] = max(next_offsets.get(tp, 0), offset + 1)
        for letter in dead:
            next_offsets[_tp(letter)] = max(next_offsets.get(_tp(letter), 0), letter.source_offset + 1)
        self.tasks.commit(next_offsets)

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True)
        self.publisher.flush()
        self.publisher.close()
        self.tasks.close()
        self.engine.close()


def take_tasks(tasks: RunReader, limit: int, group_size: int, timeout_ms: int = 100) -> tuple[list, list]:
    """Up to `limit` tasks from the tasks topic, where a record holds a whole group's
    tasks (the publisher bundles them) or one (a validation task): records are taken a
    few at a time while another group's bundle still fits."""
    events, dead = tasks.poll(timeout_ms=timeout_ms, max_records=max(1, limit // group_size))
    while (events or dead) and len(events) + group_size <= limit:
        more, more_dead = tasks.poll(timeout_ms=0, max_records=max(1, (limit - len(events)) // group_size))
        if not more and not more_dead:
            break
        events, dead = events + more, dead + more_dead
    return events, dead


def by_record(events: list) -> dict[tuple[TopicPartition, int], list[Task]]:
    """The tasks of each record taken (a bundle's tasks share its offset), in order."""
    records: dict[tuple[TopicPartition, int], list[Task]] = {}
    for task, tp, offset in events:
        if isinstance(task, Task):
            records.setdefault((tp, offset), []).append(task)
    return records


def _tp(letter) -> TopicPartition:
    return TopicPartition(letter.source_topic, letter.source_partition)
