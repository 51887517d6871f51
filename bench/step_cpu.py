"""Where a training step's CPU goes: CPU seconds per step for each process of a run.

Runs a built-in recipe (`--task arith`, the default, or `shift`; from the warmed model that bench/time_to_accuracy.py saves,
so there is no warm-up) and samples every process's CPU (psutil) while it trains. Between the ledger's step A
and step B it charges every process's user+system CPU time to the steps in between:
the run's own processes (publisher, sink, processor, learner, workers), the embedded
broker and PostgreSQL. The baseline in the same run is the wall-clock time per step,
which on 2 cores can be no less than the total CPU per step / 2.

    python bench/step_cpu.py [--task arith] [--sync-mode fully-async] [--steps 80] [--window 20:70] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from common import OUT, bench_settings, fresh_run_id
from process_cpu import CpuMeter, per_step
from rich.console import Console
from rich.table import Table
from time_to_accuracy import TASKS, bench_recipe, warmed_model

from streamrl.runtime.db import connect
from streamrl.runtime.recipe import prepare_recipe

# The processes that move events (not the ones that generate or train)
EVENT_PATH = ("publish", "broker", "processor", "sink", "postgresql")


def steps_done(conn, run_id: str) -> int:
    return conn.execute("select count(*) from train_steps where run_id = %s", (run_id,)).fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task",
        default="arith",
        choices=sorted(TASKS),
        help="arith: 2-3-token answers (the event path's worst case); shift: 48-letter answers",
    )
    parser.add_argument("--sync-mode", default="fully-async")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--window", default="20:70", help="ledger steps A:B to measure between")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override, e.g. service.broker.window_steps=10 (repeatable)",
    )
    args = parser.parse_args()
    first, last = (int(x) for x in args.window.split(":"))
    settings = bench_settings()
    recipe = prepare_recipe(TASKS[args.task].recipe)
    warm = "warm_model" if args.task == "arith" else f"warm_model_{args.task}"
    model_dir = warmed_model(recipe, OUT / "time_to_accuracy" / warm)
    run_id = fresh_run_id(f"cpu-{args.sync_mode}")
    path = bench_recipe(recipe, model_dir, args.sync_mode, args.steps, OUT / "step_cpu" / f"{run_id}.yaml")
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "run",
            str(path),
            *args.set,
            "--run",
            run_id,
            "--out",
            str(OUT / "step_cpu" / run_id),
        ],
        stdout=subprocess.DEVNULL,
    )
    marks = {}
    meter = CpuMeter(run_id)
    with connect(settings.database_url, autocommit=True) as conn:
        while run.poll() is None and len(marks) < 2:
            cpu = meter.read()  # at every poll: a process that exits keeps its last reading
            done = steps_done(conn, run_id)
            for step in (first, last):
                if step not in marks and done >= step:
                    marks[step] = (time.monotonic(), cpu)
            time.sleep(0.05)
    run.wait()
    if len(marks) < 2:
        sys.exit(f"the run ended before step {last}")
    (t0, before), (t1, after) = marks[first], marks[last]
    steps = last - first
    wall = (t1 - t0) / steps
    table = Table(title=f"CPU per step, {args.task}, {args.sync_mode}, steps {first}..{last} ({psutil.cpu_count()} cores)")
    for column in ("process", "CPU ms/step", "share"):
        table.add_column(column, justify="right" if column != "process" else "left")
    deltas = per_step(before, after, steps)
    total = sum(deltas.values())
    for role, seconds in sorted(deltas.items(), key=lambda kv: -kv[1]):
        table.add_row(role, f"{seconds * 1000:.0f}", f"{seconds / total:.0%}")
    table.add_row("all", f"{total * 1000:.0f}", "100%")
    table.add_row("wall-clock per step", f"{wall * 1000:.0f}", f"{total / wall:.2f} cores busy")
    Console().print(table)
    rollouts = recipe.trajectory_pool.batch_size * recipe.rollout_worker.rollout_repeat_n
    event_path = sum(deltas.get(role, 0.0) for role in EVENT_PATH)
    print(
        f"event path ({' + '.join(EVENT_PATH)}): {event_path * 1000:.0f} ms a step of {rollouts} rollouts, "
        f"{event_path / rollouts * 1e6:.0f} us of CPU per rollout (target <= 300)"
    )


if __name__ == "__main__":
    main()
