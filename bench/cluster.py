"""The cluster campaign: the built-in recipe (sync mode, from the committed warmed model)
laid out on ten hosts made of network namespaces as docs/operations.md's cluster page says
(tests/cluster/), every fault scenario in a run of its own, the invariants checked from
the ledger after each, and the run's time per step on the cluster beside the same recipe
on loopback (`streamrl run` on one machine), measured in the same invocation.

    python bench/cluster.py [--steps 30] [--only worker-partition,broker-restart,...]

Needs root (`ip netns`). Prints one line per scenario as it ends, then the tables that
docs/operations.md holds. Each fault strikes at step 5 of its run; its recovery is the
time from the fault's end (the link up, the processes started again) to the next train
step; its stall, the longest time without a step from the fault's start to that one.
The broker restart is the one fault a run on the embedded broker cannot survive: there
the campaign checks that every process stops, non-zero, saying why, and trains nothing
after it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from tests.cluster import scenarios  # noqa: E402
from tests.cluster.deployment import Deployment, layout  # noqa: E402
from tests.cluster.hosts import Hosts, unavailable  # noqa: E402

RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
SYNC_ENV = {"ARITH_WARMUP_STEPS": "0", "ARITH_SYNC_MODE": "sync", "ARITH_VALIDATE_EVERY": "1000"}
FAULT_AT = 5
PARTITION_STEPS = 90
STOP_WAIT_S = 60.0  # how long every process has to stop, with its reason, after the broker lost the run
SCENARIOS = (
    "worker-partition",
    "worker-kill",
    "processor-partition",
    "sink-kill",
    "learner-node-lost",
    "ledger-restart",
    "broker-restart",
)


def step_seconds(times: list[float]) -> float:
    """Median time between consecutive steps (a run's start-up comes before step 1, in no gap)."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return statistics.median(gaps) if gaps else float("nan")


def loopback_run(model: Path, steps: int, root: Path) -> tuple[float, float]:
    """The same recipe on one machine: `streamrl run` with its embedded services on
    127.0.0.1, two workers and two learner processes, the faust processor (group
    assignment), as the cluster has. (median s a step, wall s)"""
    from streamrl.runtime import db, services
    from streamrl.runtime.settings import Settings

    env = {
        **os.environ,
        **SYNC_ENV,
        "ARITH_STEPS": str(steps),
        "STREAMRL_HOME": str(root / "loopback"),
        "STREAMRL_PARTITION_ASSIGNMENT": "group",
        "STREAMRL_CORES": "1",
    }
    for key in ("STREAMRL_KAFKA_BOOTSTRAP", "STREAMRL_DATABASE_URL"):
        env.pop(key, None)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        settings = Settings.from_env()
        services.up(settings)
        db.upgrade(settings.database_url)
        run = f"loopback-{int(time.time())}"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "streamrl.cli", "run", RECIPE, f"rollout_worker.model_path={model}",
             "trainer.nproc_per_node=2", "--run", run, "--workers", "2", "--out", str(root / "loopback-out")],
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"loopback run exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        with db.connect(settings.database_url, autocommit=True) as conn:
            times = scenarios.step_times(conn, run)
        services.down(settings)
        return step_seconds(times), wall
    finally:
        os.environ.clear()
        os.environ.update(saved)


def start(deployment: Deployment, run: str, model: Path, steps: int) -> float:
    deployment.start_run(
        RECIPE, run, [f"rollout_worker.model_path={model}", "trainer.save_freq=5"], SYNC_ENV | {"ARITH_STEPS": str(steps)}
    )
    return time.monotonic()


def note(notes: list[str], text: str) -> None:
    """A finding of a scenario, printed as it is found (a scenario that then fails keeps it)."""
    notes.append(text)
    print("   ", text, flush=True)


def learner_node_lost(deployment: Deployment, run: str, steps: int) -> tuple[scenarios.FaultResult, list[str]]:
    """SIGKILL learner-2's processes. What the docs promise: the learner fails loudly
    (node 1 exits non-zero naming its lost peer, the run is marked failed); started
    again on both nodes, it resumes from its snapshot."""
    notes = []
    first = [p for p in deployment.of_host("learner-1") if p.popen.poll() is None]

    def fault() -> None:
        for process in [*first, *deployment.of_host("learner-2")]:
            process.expected_death = True
        killed_at = time.monotonic()
        deployment.hosts.kill("learner-2")
        code = first[0].popen.wait(timeout=300)
        note(notes, f"learner-1 exited {code} {time.monotonic() - killed_at:.1f} s after the kill")
        lost = [line for line in first[0].tail(400).splitlines() if "by peer" in line]  # closed or reset by peer
        note(notes, lost[0].strip()[:200] if lost else "learner-1 did not name its lost peer")
        deployment.wait_for_ledger(
            lambda conn: conn.execute("select status from runs where run_id = %s", (run,)).fetchone()[0] == "failed",
            60,
            "the run marked failed",
        )
        with deployment.ledger() as conn:
            note(
                notes,
                "ledger: "
                + conn.execute(
                    "select message from run_events where run_id = %s and kind = 'failed' order by id desc limit 1", (run,)
                ).fetchone()[0][:200],
            )
        for node in ("learner-1", "learner-2"):
            deployment.start(node, *deployment.learner_args(run, node, 2))

    result = scenarios.timed(deployment, run, "learner-2's processes SIGKILLed; both nodes started again", steps, fault)
    return result, notes


def broker_restart(deployment: Deployment, run: str) -> list[str]:
    """The broker host's broker restarted (memory storage: it loses the run's topics).
    Every process must stop, non-zero, with the reason, and no step be trained after."""
    notes: list[str] = []
    running = [p for p in deployment.processes if p.popen.poll() is None]
    step = scenarios.current_step(deployment, run)
    restarted_at = time.monotonic()
    deployment.restart_broker()
    for process in running:
        process.expected_death = True
    for process in running:
        try:
            process.popen.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            note(notes, f"{process.host} `{process.argv[3]}` still running {STOP_WAIT_S:.0f} s after the broker restart")
    codes = sorted({(p.host, p.popen.poll()) for p in running})
    note(notes, f"from step {step}: every process stopped within {time.monotonic() - restarted_at:.1f} s: {codes}")
    said = [line for p in running for line in p.tail(60).splitlines() if line.startswith("error: the Kafka broker")]
    note(notes, said[0][:220] if said else "no process said why it stopped")
    note(notes, f"steps in the ledger: {scenarios.current_step(deployment, run)} (at the restart: {step})")
    deployment.stop_all()
    return notes


def worker_back(deployment: Deployment, run: str, host: str, result: scenarios.FaultResult) -> str:
    """How long after its link came back the cut worker rolled out a task again."""
    query = """select extract(epoch from min(created_at)) from trajectories
               where run_id = %s and worker_id like %s and created_at > to_timestamp(%s)"""
    with deployment.ledger() as conn:
        (first,) = conn.execute(query, (run, f"%{host}", result.ended)).fetchone()
    if first is None:
        return f"{host} rolled out nothing after its link came back (the others took every task)"
    return f"{host} rolled out again {float(first) - result.ended:.1f} s after its link came back"


def scenario(name: str, deployment: Deployment, run: str, steps: int) -> tuple[scenarios.FaultResult, list[str]]:
    if name == "worker-partition":
        return scenarios.cut_hosts(deployment, run, ["worker-1"], steps), []
    if name == "worker-kill":
        return scenarios.kill_host(deployment, run, "worker-2", steps), []
    if name == "processor-partition":
        return scenarios.cut_hosts(deployment, run, ["processor-1"], steps), []
    if name == "sink-kill":
        return scenarios.kill_host(deployment, run, "sink", steps), []
    if name == "learner-node-lost":
        return learner_node_lost(deployment, run, steps)
    if name == "ledger-restart":
        return scenarios.timed(deployment, run, "the ledger's PostgreSQL restarted", steps, deployment.restart_ledger), []
    raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--no-loopback", action="store_true", help="skip the loopback baseline")
    args = parser.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"bench/cluster.py: {why}")
    from tests.helpers.warm_model import warm_model_folder

    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="streamrl-cluster-bench-"))
    model = warm_model_folder(root / "model")
    rows, side = [], []
    if not args.no_loopback:
        per_step, wall = loopback_run(model, args.steps, root)
        side.append(("loopback: `streamrl run`, one machine", per_step, wall))
        print(f"loopback: {per_step:.2f} s a step, {wall:.0f} s in all", flush=True)
    with Hosts(layout()) as hosts:
        deployment = Deployment(hosts, root / "cluster")
        try:
            deployment.start_services()
            run = "bench-cluster-clean"
            began = start(deployment, run, model, args.steps)
            scenarios.wait_for_finished(deployment, run)
            wall = time.monotonic() - began
            checks = scenarios.settled_invariants(deployment, run, args.steps)
            with deployment.ledger() as conn:
                per_step = step_seconds(scenarios.step_times(conn, run))
            side.append(("cluster: ten hosts, no fault", per_step, wall))
            print(f"cluster: {per_step:.2f} s a step, {wall:.0f} s in all; invariants {all(checks.values())}", flush=True)
            for name in args.only.split(","):
                run = f"bench-{name}"
                # a partition lasts 30 s: its run must outlast it (about 0.8 s a step)
                steps = max(args.steps, PARTITION_STEPS) if name.endswith("partition") else args.steps
                start(deployment, run, model, steps)
                scenarios.wait_for_step(deployment, run, FAULT_AT)
                if name == "broker-restart":  # a run cannot survive it: it must stop, saying why
                    notes = broker_restart(deployment, run)
                    rows.append((name, None, "stopped with the reason (above)", notes))
                    continue
                try:
                    result, notes = scenario(name, deployment, run, steps)
                    scenarios.wait_for_finished(deployment, run, timeout=300)
                except AssertionError as exc:  # the scenario's run did not come back: said, and the next one runs
                    deployment.stop_all()
                    first = str(exc).splitlines()[0][:300]
                    rows.append((name, None, f"FAILED: {first}", []))
                    print(f"{name}: FAILED: {first}", flush=True)
                    continue
                if name == "worker-partition":  # asked at the end: a worker rejoins its group seconds after
                    note(notes, worker_back(deployment, run, "worker-1", result))
                checks = scenarios.settled_invariants(deployment, run, steps)
                failed = [k for k, ok in checks.items() if not ok]
                rows.append((name, result, "all hold" if not failed else "FAILED: " + "; ".join(failed), notes))
                print(result.line(), "| invariants:", rows[-1][2], flush=True)
        finally:
            deployment.stop_all()
    cores = os.cpu_count() or 1
    void = " (above the cores: the ratio is void)" if load > cores else ""
    print(f"\nload average at start {load:.2f} on {cores} cores{void}")
    print("\n| layout | s a step (median) | run wall s |\n|---|---|---|")
    for label, per_step, wall in side:
        print(f"| {label} | {per_step:.2f} | {wall:.0f} |")
    if len(side) == 2:
        print(f"\ncluster / loopback, s a step: {side[1][1] / side[0][1]:.2f}")
    print("\n| scenario | fault at step | steps left after | next step after it s | longest without a step s | invariants |")
    print("|---|---|---|---|---|---|")
    for name, result, verdict, _notes in rows:
        if result is None:
            print(f"| {name} | | | | | {verdict} |")
            continue
        figures = f"{result.step_at_fault} | {result.steps_left} | {result.recovery_s:.1f} | {result.stall_s:.1f}"
        print(f"| {name} | {figures} | {verdict} |")


if __name__ == "__main__":
    main()
