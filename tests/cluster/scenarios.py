"""The faults a cluster meets, each a function over a running Deployment, and the
invariants checked from the ledger afterwards. tests/cluster/ runs some in CI;
bench/cluster.py runs them all and prints their recovery times.

A fault's recovery time is from the moment the fault ends (the link back up, the
processes started again) to the next train step the ledger records.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from tests.cluster.deployment import Deployment

PARTITION_S = 30.0  # how long a host is cut off the network


@dataclass
class FaultResult:
    name: str
    step_at_fault: int  # steps the ledger held when the fault began
    steps_left: int  # steps the run still had to train when the fault ended (0: it proves nothing)
    recovery_s: float  # fault over -> the next train step recorded
    stall_s: float  # the longest time without a train step, from the fault's start to that step
    ended: float = 0.0  # when the fault ended (seconds since the epoch)

    def line(self) -> str:
        return (
            f"{self.name}: from step {self.step_at_fault}, {self.steps_left} steps left after it; "
            f"next step {self.recovery_s:.1f} s after it ended, longest time without a step {self.stall_s:.1f} s"
        )


def steps_recorded(conn, run: str) -> int:
    return conn.execute("select count(*) from train_steps where run_id = %s", (run,)).fetchone()[0]


def step_times(conn, run: str) -> list[float]:
    rows = conn.execute("select extract(epoch from created_at) from train_steps where run_id = %s order by step", (run,))
    return [float(r[0]) for r in rows]


def wait_for_step(deployment: Deployment, run: str, step: int, timeout: float = 300) -> None:
    deployment.wait_for_ledger(lambda conn: steps_recorded(conn, run) >= step, timeout, f"step {step} of {run}")


def wait_for_finished(deployment: Deployment, run: str, timeout: float = 300) -> None:
    """The learner said the run finished and the ledger holds its last step and version."""

    def finished(conn) -> bool:
        status = conn.execute("select status from runs where run_id = %s", (run,)).fetchone()
        last = conn.execute(
            "select (select max(step) from train_steps where run_id = %s) = (select max(version) from weight_versions "
            "where run_id = %s)",
            (run, run),
        ).fetchone()
        return bool(status and status[0] == "finished" and last and last[0])

    deployment.wait_for_ledger(finished, timeout, f"{run} finished")


def settled_invariants(deployment: Deployment, run: str, steps: int, timeout: float = 90) -> dict[str, bool]:
    """The invariants once they all hold, or as they stand after `timeout` s: the sink
    writes a finished run's last events after its `finished` one, topic by topic. Then the
    run's processes are stopped (SIGTERM: each finishes what it holds)."""
    deadline = time.monotonic() + timeout
    while True:
        with deployment.ledger() as conn:
            checks = invariants(conn, run, steps)
        if all(checks.values()) or time.monotonic() > deadline:
            deployment.stop_all()
            return checks
        deployment.raise_if_a_process_failed()
        time.sleep(0.5)


def current_step(deployment: Deployment, run: str) -> int:
    with deployment.ledger() as conn:
        return steps_recorded(conn, run)


def timed(deployment: Deployment, run: str, name: str, total_steps: int, fault) -> FaultResult:
    """Runs `fault()` (which returns once the fault is over) and times the run's way back."""
    step, began = current_step(deployment, run), time.time()
    fault()
    ended = time.time()
    left = total_steps - current_step(deployment, run)
    if left > 0:
        deployment.wait_for_ledger(
            lambda conn: any(t > ended for t in step_times(conn, run)), 300, f"a step of {run} after {name}"
        )
    with deployment.ledger() as conn:
        times = step_times(conn, run)
    after = [t for t in times if t > ended]
    upto = after[0] if after else ended
    marks = [began, *(t for t in times if began < t < upto), upto]
    stall = max(b - a for a, b in itertools.pairwise(marks))
    return FaultResult(name, step, left, (after[0] - ended) if after else 0.0, stall, ended)


def cut_hosts(deployment: Deployment, run: str, hosts: list[str], total_steps: int, seconds: float = PARTITION_S) -> FaultResult:
    """The hosts' links down for `seconds`, then up again; their processes keep running."""

    def fault() -> None:
        for host in hosts:
            deployment.hosts.cut(host)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                deployment.raise_if_a_process_failed()
                time.sleep(0.5)
        finally:
            for host in hosts:
                deployment.hosts.heal(host)

    return timed(deployment, run, f"{' and '.join(hosts)} cut off for {seconds:.0f} s", total_steps, fault)


def kill_host(deployment: Deployment, run: str, host: str, total_steps: int) -> FaultResult:
    """SIGKILL every process of `host`, then start its commands again."""

    def fault() -> None:
        running = [p for p in deployment.of_host(host) if p.popen.poll() is None]
        for process in running:
            process.expected_death = True
        deployment.hosts.kill(host)
        for process in running:
            process.popen.wait(timeout=30)
        deployment.restart(running)

    return timed(deployment, run, f"{host}'s processes SIGKILLed and started again", total_steps, fault)


# --- invariants -----------------------------------------------------------------------


def invariants(conn, run: str, steps: int) -> dict[str, bool]:
    """What the ledger must show after any scenario the run survived."""

    def scalar(query: str):
        return conn.execute(query, (run,)).fetchone()[0]

    tasks = scalar("select count(*) from tasks where run_id = %s and not is_val")
    trajectories = scalar("select count(*) from trajectories where run_id = %s and not is_val")
    evaluations = scalar("select count(*) from evaluations where run_id = %s and not is_val")
    per_task = scalar(
        """select count(*) from tasks k where run_id = %s and not is_val and
           (select count(*) from trajectories t where t.run_id = k.run_id and t.task_id = k.task_id) <> 1"""
    )
    trained_without_rollout = scalar(
        """select count(*) from train_steps ts cross join unnest(ts.sample_ids) as trained(trajectory_id)
           where ts.run_id = %s and not exists (
               select 1 from trajectories t join evaluations e
                 on e.run_id = t.run_id and e.trajectory_id = t.trajectory_id
               where t.run_id = ts.run_id and t.trajectory_id = trained.trajectory_id)"""
    )
    step_numbers = [r[0] for r in conn.execute("select step from train_steps where run_id = %s order by step", (run,))]
    trained_twice = scalar(
        "select count(*) - count(distinct t) from train_steps cross join unnest(sample_ids) as t where run_id = %s"
    )
    status = scalar("select status from runs where run_id = %s")
    dead_letters = scalar("select count(*) from dead_letters where run_id = %s")
    return {
        "every task's rollout recorded exactly once": tasks == trajectories == evaluations > 0 and per_task == 0,
        "every trained sample's trajectory and evaluation in the ledger": trained_without_rollout == 0,
        "steps 1..N, none recorded twice": step_numbers == list(range(1, steps + 1)),
        "no sample trained twice": trained_twice == 0,
        "run status finished": status == "finished",
        "no dead letters": dead_letters == 0,
    }
