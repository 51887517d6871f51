"""Rollout workers in the run's consumer group: `streamrl run --workers 1` started with
STREAMRL_PARTITION_ASSIGNMENT=group (alone, `streamrl run` gives its processes fixed
shards), the first worker stopped (SIGSTOP) after step 1, a second started by hand
(`streamrl worker RUN --name extra`), then the first one SIGKILLed. The group hands the
partitions around; the run finishes with an exact ledger, and the ledger shows tasks
rolled out by both workers. A worker or processor that would share a run's partitions
another way is refused."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from streamrl.producers.publisher import create_run
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.recipe import prepare_recipe
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, process_of, run_cli, wait_for
from tests.test_rl_loop import RECIPE, assert_ledger_consistent, scalar, small_run_env

STEPS = 8  # sync mode; the first worker is stopped after step 1, so the rest wait for the one started by hand


def test_a_worker_joins_mid_run_and_the_first_one_dies(stack, ledger, run_id, tmp_path):
    env = {
        **os.environ,
        **small_run_env(ARITH_STEPS=str(STEPS), ARITH_SYNC_MODE="sync", ARITH_VALIDATE_EVERY=str(STEPS)),
        "STREAMRL_PARTITION_ASSIGNMENT": "group",
    }
    run = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "run", RECIPE, "--run", run_id, "--workers", "1", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=open(tmp_path / "run.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    extra = first = None
    try:
        steps = lambda: scalar(ledger, "select count(*) from train_steps where run_id = %s", run_id)  # noqa: E731
        wait_for(lambda: steps() >= 1, 300, what="step 1")
        # worker-0 stops (SIGSTOP) after step 1: its heartbeats stop, the group drops it
        # (session timeout), and the run's remaining steps wait for the worker started by
        # hand, however long the machine's load makes its start
        first = process_of(run_id, "worker-0")
        assert first is not None, "no worker-0 process"
        os.kill(first, signal.SIGSTOP)
        extra = cli_popen(
            [sys.executable, "-m", "streamrl.cli", "worker", run_id, "--name", "extra"],
            cwd=REPO,
            env=env,
            stdout=open(tmp_path / "extra.log", "wb"),
            stderr=subprocess.STDOUT,
        )
        # a training rollout, as the end asserts (its first may be a validation task)
        by_extra = "select count(*) from trajectories where run_id = %s and not is_val and worker_id like '%%-extra'"
        wait_for(lambda: scalar(ledger, by_extra, run_id) or run.poll() is not None, 600, what="the extra worker's first task")
        assert scalar(ledger, by_extra, run_id), "the run ended before the worker started by hand rolled out a task"
        os.kill(first, signal.SIGKILL)  # streamrl run restarts it
        first = None  # gone: its pid is not signalled again below
        assert run.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if first is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first, signal.SIGCONT)  # a stopped process would not take the SIGTERM below
        for process in (run, extra):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    assert_ledger_consistent(ledger, run_id, steps=STEPS, staleness_threshold=0)
    by_worker = dict(
        ledger.execute(
            "select split_part(worker_id, '-', -1), count(*) from trajectories where run_id = %s and not is_val group by 1",
            (run_id,),
        ).fetchall()
    )
    assert by_worker.keys() == {"0", "extra"} and min(by_worker.values()) > 0, by_worker
    assert "worker-0 exited with signal 9; restarting it" in (tmp_path / "logs" / "supervisor.log").read_text()


def test_a_fully_async_worker_killed_mid_run_leaves_an_exact_ledger(stack, ledger, run_id, tmp_path):
    """fully-async: the worker takes tasks as room frees and commits below its oldest
    record still rolling out, so a SIGKILL between its commits loses no task and trains
    none twice (the restarted worker rolls out again what was not committed)."""
    steps = 12
    env = {**os.environ, **small_run_env(ARITH_STEPS=str(steps), ARITH_VALIDATE_EVERY="12")}
    run = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "run", RECIPE, "--run", run_id, "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=open(tmp_path / "run.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: scalar(ledger, "select count(*) from train_steps where run_id = %s", run_id) >= 2, 300, what="step 2")
        os.kill(process_of(run_id, "worker-0"), signal.SIGKILL)  # streamrl run restarts it
        assert run.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=60)
    assert_ledger_consistent(ledger, run_id, steps=steps, staleness_threshold=1)
    assert "worker-0 exited with signal 9; restarting it" in (tmp_path / "logs" / "supervisor.log").read_text()


def test_a_process_that_would_share_partitions_another_way_than_the_run_is_refused(stack, run_id):
    """A run created as `streamrl run` creates it (fixed shards): a worker or processor in
    a consumer group would roll out or group what the shard owners already do."""
    import dataclasses

    with EventPublisher(stack) as publisher:
        create_run(dataclasses.replace(stack, partition_assignment="shard"), run_id, prepare_recipe(RECIPE), publisher)
    for command in (["worker", run_id, "--name", "extra"], ["processor", run_id]):
        result = run_cli(*command, env={"STREAMRL_PARTITION_ASSIGNMENT": "group"}, timeout=120)
        assert result.returncode != 0
        assert "STREAMRL_PARTITION_ASSIGNMENT=shard to join it" in result.stdout + result.stderr, result.stderr[-2000:]
