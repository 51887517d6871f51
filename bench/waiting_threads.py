"""Two sync-mode runs of the built-in recipe side by side, with torch's waiting threads
spinning (libgomp's default) and sleeping (`OMP_WAIT_POLICY=PASSIVE`, StreamRL's
default): each run's wall-clock and its processes' CPU, by role (services already up, as
after `streamrl up`; run nothing else beside it).

    python bench/waiting_threads.py [--steps 20] [--cores 2] [--pairs 1]

Each run gets `STREAMRL_CORES` cores (2: the learner and worker each use both, as a run
alone on this machine does), so two runs put twice as many torch threads as cores on the
machine: what a test suite or a shared machine does. Prints one row a run, then the mean
of each setting and the ratio of the spinning setting's to the sleeping one's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_cpu import CpuMeter

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "arith" / "recipe.yaml"
SETTINGS = {"spinning (libgomp's default)": "", "sleeping (PASSIVE)": "PASSIVE"}  # "" reads as unset


def run_env(steps: int, cores: int, wait_policy: str) -> dict:
    return {
        **os.environ,
        "OMP_WAIT_POLICY": wait_policy,
        "STREAMRL_CORES": str(cores),
        "ARITH_SYNC_MODE": "sync",
        "ARITH_STEPS": str(steps),
        "ARITH_WARMUP_STEPS": "30",
        "ARITH_VALIDATE_EVERY": str(steps // 2),
    }


def watch(run: subprocess.Popen, run_id: str) -> dict[str, float]:
    """CPU seconds by role of the run's processes, the last reading of each before it ended."""
    meter = CpuMeter(run_id)
    totals: dict[str, float] = {}
    while run.poll() is None:
        totals = meter.read()
        time.sleep(0.5)
    roles = ("learner", "worker", "orchestrator", "processor", "sink", "publish")
    return {role: seconds for role, seconds in totals.items() if role in roles}


def pair(steps: int, cores: int, wait_policy: str, out: Path) -> list[dict]:
    """Two runs started together; each one's wall-clock and CPU by role."""
    results: list[dict] = [{}, {}]
    failures: list[str] = []  # said from the main thread: an exception in a thread only ends it

    def one(index: int) -> None:
        run_id = f"threads-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        run = subprocess.Popen(
            [sys.executable, "-m", "streamrl.cli", "run", str(RECIPE), "--run", run_id, "--out", str(out / run_id)],
            cwd=REPO,
            env=run_env(steps, cores, wait_policy),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cpu = watch(run, run_id)
        if run.returncode != 0:
            failures.append(f"{run_id} exited {run.returncode}: its logs are in {out / run_id / 'logs'}")
        results[index] = {"wall_s": time.perf_counter() - started, **cpu}

    threads = [threading.Thread(target=one, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit("\n".join(failures))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=1, help="pairs of runs for each setting")
    parser.add_argument("--out", type=Path, default=Path("bench/out/waiting_threads"))
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"two sync-mode runs side by side, {args.steps} steps, STREAMRL_CORES={args.cores} each")
    for column in ("torch's waiting threads", "wall s", "learner CPU s", "worker CPU s", "orchestrator CPU s"):
        table.add_column(column)
    means: dict[str, dict[str, float]] = {}
    for label, policy in SETTINGS.items():
        runs = [r for _ in range(args.pairs) for r in pair(args.steps, args.cores, policy, args.out)]
        for r in runs:
            table.add_row(label, *(f"{r.get(k, 0.0):.1f}" for k in ("wall_s", "learner", "worker", "orchestrator")))
        means[label] = {k: sum(r.get(k, 0.0) for r in runs) / len(runs) for k in ("wall_s", "learner", "worker")}
    console.print(table)
    spinning, sleeping = means.values()
    for key in ("wall_s", "learner", "worker"):
        console.print(f"{key}: spinning {spinning[key]:.1f}, sleeping {sleeping[key]:.1f}: {spinning[key] / sleeping[key]:.2f}x")


if __name__ == "__main__":
    main()
