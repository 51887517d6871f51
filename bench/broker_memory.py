"""The embedded broker's memory across runs: finished runs' topics kept (the baseline,
`service.broker.retention: keep`) against removed once the ledger holds them (`remove`,
the default).

For each setting, a fresh embedded broker carries RUNS runs of the built-in recipe one
after another. Its resident memory is read after each. The removal's own time is
measured too: it happens after the run's processes have stopped, so it costs the
training path nothing. The keep series' topics are then removed by hand
(`runtime.topic_retention.retire_run_topics`), timed, and the memory read again.

    python bench/broker_memory.py [--runs 4] [--steps 60]

Prints a table and writes bench/out/broker_memory.{json,png}.
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

from common import OUT, fresh_run_id

from streamrl.runtime import db, services
from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_retention import retire_run_topics

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "arith" / "recipe.yaml"


def fresh_broker(home: Path) -> Settings:
    """Embedded services of their own under `home`, on ports the OS picks."""
    os.environ["STREAMRL_HOME"] = str(home)
    for name in ("STREAMRL_KAFKA_BOOTSTRAP", "STREAMRL_DATABASE_URL", "STREAMRL_KAFKA_PORT"):
        os.environ.pop(name, None)
    settings = Settings.from_env()
    services.up(settings)
    db.upgrade(settings.database_url)
    return settings


def one_run(settings: Settings, retention: str, steps: int, out: Path) -> tuple[str, float, str]:
    run_id = fresh_run_id(f"broker-{retention}")
    env = {
        **os.environ,
        "STREAMRL_HOME": str(settings.home),
        "ARITH_STEPS": str(steps),
        "ARITH_WARMUP_STEPS": "5",
        "ARITH_VALIDATE_EVERY": str(steps),
    }
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "run",
            str(RECIPE),
            f"service.broker.retention={retention}",
            "--run",
            run_id,
            "--out",
            str(out / run_id),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"run {run_id} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    said = " ".join(line for line in result.stdout.splitlines() if "topics" in line and run_id in line)
    return run_id, time.monotonic() - started, " ".join(said.split())


def series(retention: str, runs: int, steps: int, workdir: Path) -> dict:
    settings = fresh_broker(workdir / retention)
    try:
        rss = [services.broker_memory_bytes(settings)]
        run_ids, lines = [], []
        for i in range(runs):
            run_id, seconds, said = one_run(settings, retention, steps, workdir / "runs")
            run_ids.append(run_id)
            lines.append(said)
            rss.append(services.broker_memory_bytes(settings))
            print(f"  {retention}: run {i + 1}/{runs} in {seconds:.0f} s, broker {rss[-1] / 2**20:.0f} MB", flush=True)
        removal_s = []
        for run_id in run_ids:  # what is left on the broker (keep: everything), removed by hand and timed
            started = time.monotonic()
            retired = retire_run_topics(settings, run_id)
            removal_s.append(time.monotonic() - started)
            assert not retired.behind, retired.sentence(run_id)
        time.sleep(2)
        return {
            "rss_mb": [r / 2**20 for r in rss],
            "after_removal_mb": services.broker_memory_bytes(settings) / 2**20,
            "removal_s": removal_s,
            "said": lines,
        }
    finally:
        services.down(settings)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for retention, result in results.items():
        ax.plot(range(len(result["rss_mb"])), result["rss_mb"], marker="o", label=f"retention: {retention}")
    ax.set_xlabel("runs finished on the broker")
    ax.set_ylabel("embedded broker RSS (MB)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="broker-memory-"))
    results = {}
    for retention in ("keep", "remove"):
        print(f"retention: {retention} ({args.runs} runs of {args.steps} steps on a fresh broker)", flush=True)
        results[retention] = series(retention, args.runs, args.steps, workdir)
    print(f"\n{'runs finished':<15}{'keep (MB)':>12}{'remove (MB)':>13}")
    for i in range(args.runs + 1):
        print(f"{i:<15}{results['keep']['rss_mb'][i]:>12.0f}{results['remove']['rss_mb'][i]:>13.0f}")
    keep_removal = results["keep"]["removal_s"]
    print(
        f"keep series, its {args.runs} runs' topics then removed: {results['keep']['after_removal_mb']:.0f} MB; "
        f"removal took {min(keep_removal):.2f}-{max(keep_removal):.2f} s per run, after the run's processes stopped "
        f"(on the training path: none)"
    )
    print(f"what a run with retention: remove said: {results['remove']['said'][-1]}")
    (OUT / "broker_memory.json").write_text(json.dumps(results, indent=2))
    plot(results, OUT / "broker_memory.png")
    print(f"wrote {OUT / 'broker_memory.json'} and {OUT / 'broker_memory.png'}")


if __name__ == "__main__":
    main()
