"""A fully-async worker takes tasks as room frees (producers/worker_loop.py:
`_take_as_room_frees`): a group with long answers holds only its own tasks, never the
worker's next ones, and the committed offset never passes a record still rolling out
or one that failed (a restart rolls it out again)."""

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


def continuous_worker(records: RecordQueue, roll_out, limit: int) -> WorkerLoop:
    worker = WorkerLoop.__new__(WorkerLoop)
    worker.cfg = SimpleNamespace(max_concurrent_tasks=limit, rollout_repeat_n=GROUP_SIZE)
    worker.stop, worker.failures, worker.followers = threading.Event(), [], []
    worker.tasks, worker.unread_reported, worker.done = records, True, 0
    worker.publisher = SimpleNamespace(publish=lambda event: None, send_held=lambda key=None: None, flush=lambda **kw: None)
    worker._weights_for = lambda batch: True
    worker._roll_out = roll_out
    worker.close = lambda: None
    return worker


def test_a_long_group_holds_only_its_own_tasks_and_the_commit_waits_below_it():
    records = RecordQueue(groups=4)
    groups = [record[0].group_id for record in records.records]
    release, order = threading.Event(), []

    def roll_out(batch):
        group = batch[0].group_id
        order.append(("start", group))
        if group == groups[0]:  # the long answers: until the last group has been rolled out beside them
            assert release.wait(30), "the other groups were not rolled out while the first one ran"
        order.append(("end", group))
        if group == groups[-1]:
            release.set()

    # room for two groups: the long one and one more at a time
    worker = continuous_worker(records, roll_out, limit=2 * GROUP_SIZE)
    worker._take_as_room_frees(idle_exit_s=0.2)

    assert worker.done == 4 * GROUP_SIZE and not worker.failures
    assert [g for kind, g in order if kind == "end"] == groups[1:] + groups[:1]
    assert records.commits[:-1] and set(records.commits[:-1]) == {0}, "committed past a record still rolling out"
    assert records.commits[-1] == 4


def test_a_failed_record_stops_the_worker_and_is_never_committed():
    records = RecordQueue(groups=3)
    failing = records.records[1][0].group_id

    def roll_out(batch):
        if batch[0].group_id == failing:
            raise RuntimeError("the inference server went away")

    worker = continuous_worker(records, roll_out, limit=GROUP_SIZE)
    worker._take_as_room_frees(idle_exit_s=0.2)
    assert [str(e) for e in worker.failures] == ["the inference server went away"] and worker.stop.is_set()
    assert records.commits and max(records.commits) == 1  # the failed record (offset 1) is read again after a restart
    assert records.read == 2  # nothing was taken after the failure
