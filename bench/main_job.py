"""The main job (`make run`: the built-in arith recipe) across seeds: held-out accuracy
before and after, and the wall-clock of each run, from launching `streamrl run` to its
exit (services already up, as after `make run`'s `streamrl up`).

    python bench/main_job.py [--seeds 1,2,3,4,5] [overrides...]

Each seed sets `trainer.seed` (the warm-up's batches, the workers' sampling) and
`data.seed` (the order of the training prompts). Prints one row a seed, then the count
at or above the README's promise (0.9) and the slowest run against its 3-minute budget.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "arith" / "recipe.yaml"
TARGET, BUDGET_S = 0.9, 180.0


def run_seed(seed: int, overrides: list[str]) -> dict:
    from streamrl.report import load_summary
    from streamrl.runtime.settings import Settings

    run_id = f"main-job-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    command = [sys.executable, "-m", "streamrl.cli", "run", str(RECIPE), f"trainer.seed={seed}", f"data.seed={seed}", *overrides]
    started = time.perf_counter()
    done = subprocess.run([*command, "--run", run_id], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: streamrl run exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary = load_summary(Settings.from_env().database_url, run_id, with_counts=False)
    return {
        "seed": seed,
        "run_id": run_id,
        "wall_s": wall,
        "warmup_steps": summary.warmup.get("warmup_steps"),
        "val_accuracy_first": summary.val_accuracy[0],
        "val_accuracy_last": summary.val_accuracy[-1],
        "val_rows": summary.val_counts[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    rows = []
    print(f"{'seed':>4}  {'warm-up steps':>13}  {'before GRPO':>11}  {'after':>6}  {'wall s':>6}", flush=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        row = run_seed(seed, args.overrides)
        rows.append(row)
        print(
            f"{seed:>4}  {row['warmup_steps']:>13}  {row['val_accuracy_first']:>11.3f}  "
            f"{row['val_accuracy_last']:>6.3f}  {row['wall_s']:>6.0f}",
            flush=True,
        )
    reached = sum(r["val_accuracy_last"] >= TARGET for r in rows)
    slowest = max(r["wall_s"] for r in rows)
    print(f"held-out accuracy >= {TARGET}: {reached} of {len(rows)} runs; slowest {slowest:.0f} s (budget {BUDGET_S:.0f} s)")
    out = REPO / "bench" / "out" / "main_job.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
