"""Learning curves across seeds and weight-sync modes, with a paired test between modes.

    python bench/learning.py [--seeds 1,2,3,4,5] [--modes sync,fully-async] [--steps 100]

Every run is the built-in arith recipe from the committed warmed model
(tests/data/arith_warm, held-out 0.695), no warm-up, `--steps` GRPO steps, validated
every quarter of them; a seed sets `trainer.seed` and `data.seed`. The same seed in two
modes trains on the same prompts in the same order, so the modes are compared seed by
seed: the mean of the per-seed differences in final held-out accuracy, its standard
error, and a paired t-test (scipy.stats.ttest_rel). Prints one row per run, the curves'
table and the test; writes bench/out/learning.{json,png}.

Needs the embedded services (`streamrl up`) and the bench extra (scipy).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "arith" / "recipe.yaml"
OUT = REPO / "bench" / "out"


def warm_model() -> Path:
    sys.path.insert(0, str(REPO))
    from tests.helpers.warm_model import warm_model_folder

    folder = OUT / "learning_model"
    if not (folder / "config.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        warm_model_folder(folder)
    return folder


def held_out_curve(run_id: str) -> dict[int, float]:
    from streamrl.runtime import db
    from streamrl.runtime.settings import Settings

    with db.connect(Settings.from_env().database_url, autocommit=True) as conn:
        rows = conn.execute(
            "select step, avg(reward) from evaluations where run_id = %s and is_val group by step order by step", (run_id,)
        ).fetchall()
    return {int(step): float(mean) for step, mean in rows}


def run(seed: int, mode: str, steps: int, model: Path) -> dict:
    run_id = f"learning-{mode}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    env = {"ARITH_STEPS": str(steps), "ARITH_WARMUP_STEPS": "0", "ARITH_VALIDATE_EVERY": str(max(1, steps // 4))}
    overrides = [f"rollout_worker.model_path={model}", f"trainer.seed={seed}", f"data.seed={seed}", f"weight.sync_mode={mode}"]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "run", str(RECIPE), *overrides, "--run", run_id],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{run_id}: streamrl run exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {
        "seed": seed,
        "mode": mode,
        "run_id": run_id,
        "wall_s": time.perf_counter() - started,
        "curve": held_out_curve(run_id),
    }


def paired_test(runs: list[dict], first: str, second: str, steps: int) -> str:
    from scipy.stats import ttest_rel

    final = {(r["mode"], r["seed"]): r["curve"][steps] for r in runs}
    seeds = sorted({seed for mode, seed in final if mode == first} & {seed for mode, seed in final if mode == second})
    if len(seeds) < 2:
        return f"paired test: needs two seeds in both {first} and {second}"
    a, b = [final[(first, s)] for s in seeds], [final[(second, s)] for s in seeds]
    differences = [x - y for x, y in zip(a, b)]
    mean = sum(differences) / len(differences)
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1))
    test = ttest_rel(a, b)
    return (
        f"final held-out accuracy, {first} - {second}, paired over seeds {seeds}: mean {mean:+.4f}, "
        f"standard error {sd / math.sqrt(len(seeds)):.4f}, t = {test.statistic:.2f}, p = {test.pvalue:.3f}"
    )


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    colours = {"sync": "tab:blue", "fully-async": "tab:orange", "batch-async": "tab:green"}
    for r in runs:
        versions = sorted(r["curve"])
        axes.plot(versions, [r["curve"][v] for v in versions], color=colours.get(r["mode"], "grey"), alpha=0.7)
    for mode, colour in colours.items():
        if any(r["mode"] == mode for r in runs):
            axes.plot([], [], color=colour, label=mode)
    axes.set_xlabel("weight version (GRPO step)")
    axes.set_ylabel("held-out greedy accuracy (200 prompts)")
    axes.set_title("arith from the warmed model, one line per seed")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--modes", default="sync,fully-async")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    model, modes = warm_model(), args.modes.split(",")
    runs = []
    print(f"{'mode':>12} {'seed':>4}  held-out accuracy by version  {'wall s':>6}", flush=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for mode in modes:
            result = run(seed, mode, args.steps, model)
            runs.append(result)
            curve = "  ".join(f"{v}: {a:.3f}" for v, a in sorted(result["curve"].items()))
            print(f"{mode:>12} {seed:>4}  {curve}  {result['wall_s']:>6.0f}", flush=True)
    for first, second in itertools.pairwise(modes):
        print(paired_test(runs, first, second, args.steps))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "learning.json").write_text(json.dumps(runs, indent=1))
    plot(runs, OUT / "learning.png")
    print(f"wrote {OUT / 'learning.json'} and {OUT / 'learning.png'}")


if __name__ == "__main__":
    main()
