"""One long run's broker memory: a default run (`service.broker.window_steps: auto`,
which rotates the topics in windows on the embedded broker) against one topic per kind
(`window_steps: null`, the baseline), or against windows of a chosen size (`--window`).

Each setting gets a fresh embedded broker and PostgreSQL, and one run of the built-in
recipe with fixed shards (what `streamrl run` gives its processes), so that they differ
by rotation alone. While it trains, the broker's resident memory and the trained step
count are read every 2 s. The run's time per step is what rotation costs on the
training path (the windows are made by the publishers and retired by the ledger sink,
off the learner's path). The baseline may run fewer steps (`--baseline-steps`): it
grows linearly, and at 5,000 steps it would hold about 3 GB.

    python bench/broker_window.py [--steps 5000] [--baseline-steps 1000] [--window N]

Prints RSS against steps for both, the step time of each, and writes
bench/out/broker_window.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from broker_memory import RECIPE, ROOT, fresh_broker
from common import OUT, fresh_run_id

from streamrl.runtime import db, services
from streamrl.runtime.settings import Settings


def trained_steps(settings: Settings, run_id: str) -> int:
    try:
        with db.connect(settings.database_url, autocommit=True) as conn:
            return conn.execute("select count(*) from train_steps where run_id = %s", (run_id,)).fetchone()[0]
    except Exception:  # not migrated yet at the very start
        return 0


def one_long_run(settings: Settings, label: str, steps: int, window: str, out: Path) -> dict:
    """`window`: the run's service.broker.window_steps (auto, null or a number)."""
    run_id = fresh_run_id("plain" if window == "null" else "window")
    # both with fixed shards, the assignment a rotating run uses, so the step times differ by rotation alone
    env = {
        **os.environ,
        "STREAMRL_HOME": str(settings.home),
        "ARITH_STEPS": str(steps),
        "ARITH_WARMUP_STEPS": "30",
        "ARITH_VALIDATE_EVERY": str(steps),
        "STREAMRL_PARTITION_ASSIGNMENT": "shard",
        "COLUMNS": "300",
    }
    overrides = [f"service.broker.window_steps={window}"] if window != "auto" else []
    started = time.monotonic()
    run = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "run", str(RECIPE), *overrides, "--run", run_id, "--out", str(out / run_id)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    samples: list[tuple[int, float]] = []  # (trained steps, broker RSS in MB)
    first_step_at = None
    while run.poll() is None:
        done = trained_steps(settings, run_id)
        if done and first_step_at is None:
            first_step_at = time.monotonic()
        samples.append((done, services.broker_memory_bytes(settings) / 2**20))
        if len(samples) % 30 == 0:
            print(f"  {label}: step {done}/{steps}, broker {samples[-1][1]:.0f} MB", flush=True)
        time.sleep(2.0)
    output = run.stdout.read()
    if run.returncode != 0:
        raise SystemExit(f"run {run_id} failed:\n{output[-3000:]}")
    wall = time.monotonic() - (first_step_at or started)
    said = [" ".join(line.split()) for line in output.splitlines() if "windows" in line or "topics" in line]
    return {"run_id": run_id, "window_steps": window, "samples": samples, "seconds_per_step": wall / steps, "said": said}


def rss_at(samples: list[tuple[int, float]], step: int) -> float | None:
    """The broker's RSS at the first sample at or past `step`."""
    return next((rss for done, rss in samples if done >= step), None)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, result in results.items():
        steps, rss = zip(*result["samples"])
        ax.plot(steps, rss, label=label)
    ax.set_xlabel("trained steps")
    ax.set_ylabel("embedded broker RSS (MB)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--baseline-steps", type=int, default=None, help="default: --steps")
    parser.add_argument("--window", default="auto", help="the rotating run's window_steps (default: the recipe's auto)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="broker-window-"))
    results = {}
    rotated_label = "default (window_steps auto)" if args.window == "auto" else f"window_steps {args.window}"
    plan = (("one topic per kind", "null", args.baseline_steps or args.steps), (rotated_label, args.window, args.steps))
    for label, window, steps in plan:
        print(f"{label}: {steps} steps on a fresh broker", flush=True)
        settings = fresh_broker(workdir / window)
        try:
            results[label] = one_long_run(settings, label, steps, window, workdir / "runs")
        finally:
            services.down(settings)
    base, rotated = results.values()
    checkpoints = sorted({s for s in (100, 250, 500, 1000, 2000, 3000, 4000, 5000, args.steps) if s <= args.steps})
    print(f"\n{'trained steps':<15}{'one topic per kind (MB)':>25}{f'{rotated_label} (MB)':>32}")
    for step in checkpoints:
        print(
            f"{step:<15}{rss_at(base['samples'], step) or float('nan'):>25.0f}"
            f"{rss_at(rotated['samples'], step) or float('nan'):>32.0f}"
        )
    print(
        f"time per step: {base['seconds_per_step']:.3f} s one topic per kind, {rotated['seconds_per_step']:.3f} s "
        f"with windows ({rotated['seconds_per_step'] / base['seconds_per_step'] - 1:+.1%})"
    )
    warm, end = args.steps // 5, args.steps
    first, last = rss_at(rotated["samples"], warm), rss_at(rotated["samples"], end)  # before the run's end removes its topics
    if first is not None and last is not None:  # flat after warm-up?
        print(f"from step {warm} to step {end}: {first:.0f} -> {last:.0f} MB ({(last - first) / (end - warm):+.4f} MB a step)")
    for line in rotated["said"]:
        print(f"the rotating run said: {line}")
    (OUT / "broker_window.json").write_text(json.dumps(results, indent=2))
    plot(results, OUT / "broker_window.png")
    print(f"wrote {OUT / 'broker_window.json'} and {OUT / 'broker_window.png'}")


if __name__ == "__main__":
    main()
