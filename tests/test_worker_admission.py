"""A fully-async worker takes tasks as room frees (producers/worker_loop.py:
`_take_as_room_frees`): a group with long answers holds only its own unfinished
rollouts, never the worker's next tasks, and the committed offset never passes a record
still rolling out or one that failed (a restart rolls it out again)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from kafka import TopicPartition

from streamrl.producers.publisher import step_tasks
from streamrl.producers.worker_loop import WorkerLoop
from streamrl.runtime.bus import RunReader

TASKS = TopicPartition("run-x.tasks", 0)
GROUP_SIZE = 2


class RecordQueue:
    """The tasks partition as a list of records (a group's tasks each), read in order."""

    def __init__(self, groups: int):
        tasks = step_tasks("run-x", 1, [{"q": str(g)} for g in range(groups)], GROUP_SIZE, "q", 0)
        self.records = [tasks[i : i + GROUP_SIZE] for i in range(0, len(tasks), GROUP_SIZE)]
        self.read = 0  # the next record's offset
        self.commits: list[int] = []

    def poll(self, timeout_ms: int, max_records: int):
        taken = self.records[self.read : self.read + max_records]
        events = [(task, TASKS, self.read + i) for i, record in enumerate(taken) for task in record]
        self.read += len(taken)
        return events, []

    def positions(self) -> dict[TopicPartition, int]:
        return {TASKS: self.read}

    first_needed_offsets = RunReader.first_needed_offsets

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(offsets[TASKS])


class BatchWorker:
    """A worker that samples a record's tasks as one batch, each ending when `rollout(task)`
    returns, and says so as it ends (as SingleTurnWorker.run_tasks does)."""

    def __init__(self, rollout):
        self.rollout = rollout

    def run_tasks(self, batch, max_retries, done):
        for task in batch:
            self.rollout(task)
            done(task)
        return []


def continuous_worker(records: RecordQueue, rollout, limit: int) -> WorkerLoop:
    worker = WorkerLoop.__new__(WorkerLoop)
    worker.cfg = SimpleNamespace(max_concurrent_tasks=limit, rollout_repeat_n=GROUP_SIZE, max_retries=0)
    worker.stop, worker.failures, worker.followers = threading.Event(), [], []
    worker.tasks, worker.unread_reported, worker.done = records, True, 0
    worker.undone, worker._room_lock = 0, threading.Lock()
    worker.publisher = SimpleNamespace(publish=lambda event: None, send_held=lambda key=None: None, flush=lambda **kw: None)
    worker.worker = BatchWorker(rollout)
    worker._weights_for = lambda batch: True
    worker.close = lambda: None
    return worker


def test_a_long_group_holds_only_its_own_tasks_and_the_commit_waits_below_it():
    records = RecordQueue(groups=4)
    groups = [record[0].group_id for record in records.records]
    release, ended = threading.Event(), []

    def rollout(task):
        if task.group_id == groups[0]:  # the long answers: until the last group has been rolled out beside them
            assert release.wait(30), "the other groups were not rolled out while the first one ran"
        ended.append(task.group_id)
        if ended.count(task.group_id) == GROUP_SIZE and task.group_id == groups[-1]:
            release.set()

    # room for two groups: the long one and one more at a time
    worker = continuous_worker(records, rollout, limit=2 * GROUP_SIZE)
    worker._take_as_room_frees(idle_exit_s=0.2)

    assert worker.done == 4 * GROUP_SIZE and not worker.failures and worker.undone == 0
    assert list(dict.fromkeys(ended[::-1]))[::-1] == groups[1:] + groups[:1]  # the order of the groups' last ends
    assert records.commits[:-1] and set(records.commits[:-1]) == {0}, "committed past a record still rolling out"
    assert records.commits[-1] == 4


def test_a_groups_finished_rollouts_free_their_room_while_its_last_one_runs():
    """Room for a group and a half: a group whose first rollout is done and whose second
    is long holds one slot, so the next groups are rolled out beside it. Counted by
    group, the long group would hold both slots and nothing would start."""
    records = RecordQueue(groups=4)
    groups = [record[0].group_id for record in records.records]
    release, ended = threading.Event(), []

    def rollout(task):
        if task.group_id == groups[0] and ended.count(groups[0]) == 1:  # its second rollout: the long one
            assert release.wait(30), "the next groups waited for the long group's last rollout"
        ended.append(task.group_id)
        if ended.count(groups[-1]) == GROUP_SIZE:
            release.set()

    worker = continuous_worker(records, rollout, limit=GROUP_SIZE + GROUP_SIZE // 2)
    worker._take_as_room_frees(idle_exit_s=0.2)

    assert worker.done == 4 * GROUP_SIZE and not worker.failures and worker.undone == 0
    assert ended[-1] == groups[0]
    assert records.commits[-1] == 4


def test_a_failed_record_stops_the_worker_and_is_never_committed():
    records = RecordQueue(groups=3)
    failing = records.records[1][0].group_id

    def rollout(task):
        if task.group_id == failing:
            raise RuntimeError("the inference server went away")

    worker = continuous_worker(records, rollout, limit=GROUP_SIZE)
    worker._take_as_room_frees(idle_exit_s=0.2)
    assert [str(e) for e in worker.failures] == ["the inference server went away"] and worker.stop.is_set()
    assert records.commits and max(records.commits) == 1  # the failed record (offset 1) is read again after a restart
    assert records.read == 2  # nothing was taken after the failure
