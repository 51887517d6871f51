"""Time to a held-out accuracy: StreamRL (fully-async, batch-async, sync) against TRL's
GRPOTrainer, on two built-in tasks of opposite shapes.

    shift   48-letter answers (~49 sampled tokens a rollout): generation is most of a
            step, the shape of real RL post-training. Held-out accuracy: the mean
            partial credit (letters right) of answers sampled at temperature 1; target 0.85.
    arith   2-3-token answers: a step's model work is tiny and moving its events is
            not, the overhead-bound worst case. Held-out accuracy: greedy exact match; 0.9.

Every contender starts from the same model: the recipe's tiny Qwen2 after the recipe's
own cross-entropy warm-up, done once here and saved. Each then runs GRPO on the same
data with the same hyper-parameters (the recipe's groups, lr and cosine decay, clip,
no KL, token-mean loss, group-normalised advantages, temperature, response length),
float32, and is scored on the same held-out rows by the recipe's evaluator.

The clock:
- StreamRL: from launching `streamrl run` (process start-up, topic creation and model
  loading included) to the moment the ledger holds the last validation result of the
  first version at or above the target.
- TRL: from launching its process (`bench/tta_trl.py`: Python's start, the imports and
  the model's loading included, as for StreamRL) to the end of the first step whose
  check reaches the target, minus the time spent in those checks (StreamRL's workers
  score validation prompts alongside training, so TRL is not charged for its own).

Threads: TRL runs in one process with torch's default (one thread a core); StreamRL's
processes take the budgets runtime/threads.py gives them (every core each in sync mode, where
the learner and the worker take turns; one core each in the asynchronous modes, on 2 cores).

Prints, per task, the ratios against TRL (median over seeds) beside the targets, TRL's
step split (generation + scoring, training) and StreamRL's CPU a step by process, and
writes bench/out/time_to_accuracy.{json,png}.

    python bench/time_to_accuracy.py [--tasks shift,arith] [--seeds 2] [--only fully-async,sync,batch-async,trl]

Needs the bench extra (`pip install -e '.[all,bench]'`, which `make bench` does) for TRL,
and the embedded services (started here if they are not running).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from process_cpu import CpuMeter, per_step  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from streamrl.learner.warmup import cross_entropy_warmup, greedy_exact_match, supervised_items  # noqa: E402
from streamrl.runtime.chat_template import recipe_renderer  # noqa: E402
from streamrl.runtime.config import Recipe  # noqa: E402
from streamrl.runtime.dataset import read_rows  # noqa: E402
from streamrl.runtime.db import connect  # noqa: E402
from streamrl.runtime.recipe import prepare_recipe  # noqa: E402
from streamrl.runtime.settings import Settings  # noqa: E402
from streamrl.runtime.tiny_lm import load  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Task:
    recipe: Path
    target: float  # held-out accuracy to reach
    steps: int  # GRPO steps at most
    validate_every: int
    ratio_targets: dict  # system -> wall-clock ratio to TRL to meet
    # The warm-up stops at this greedy held-out accuracy (None: the recipe's step count).
    # The arithmetic rule is learned abruptly by cross-entropy: on this machine a target
    # of 0.25 (the recipe's before 2026-11-26; 0.5 now) stopped at 0.32, from where no
    # contender passed 0.59 in 400 GRPO steps at lr 3e-4, and the full 1,000 steps reached
    # 0.985, leaving nothing to learn.
    warm_until: float | None = None


TASKS = {
    "shift": Task(ROOT / "recipes" / "shift" / "recipe.yaml", 0.85, 80, 10, {"streamrl-fully-async": 0.8, "streamrl-sync": 1.2}),
    "arith": Task(
        ROOT / "recipes" / "arith" / "recipe.yaml",
        0.9,
        400,
        25,
        {"streamrl-fully-async": 1.5, "streamrl-sync": 2.0},
        warm_until=0.6,
    ),
}
RECIPE = TASKS["arith"].recipe  # the short-answer recipe other benchmarks measure
OUT = ROOT / "bench" / "out" / "time_to_accuracy"


def warmed_model(recipe: Recipe, directory: Path, until: float | None = None) -> Path:
    """The recipe's cross-entropy warm-up, once, saved for every contender; with
    `until`, it stops at the first check (every 10 steps) whose greedy held-out accuracy
    reaches it (the task's `warm_until`)."""
    if (directory / "config.json").exists():
        return directory
    cfg, data, val = recipe.trainer, recipe.data, recipe.validate.data
    torch.manual_seed(cfg.seed)
    tokenizer, model = load(recipe.rollout_worker.model_path)
    renderer = recipe_renderer(recipe, tokenizer)
    rows = read_rows(data.data_files, data.type, [data.prompt_key, data.answer_key])
    items = supervised_items(rows, renderer, data.prompt_key, data.answer_key)
    val_rows = read_rows(val.data_files, data.type)[: val.max_rows or None]

    def reached() -> bool:
        accuracy = greedy_exact_match(
            model, renderer, val_rows, data.prompt_key, data.answer_key, recipe.rollout_worker.max_response_length
        )
        model.train()
        return accuracy >= until

    details = cross_entropy_warmup(
        model,
        tokenizer,
        items,
        cfg.warmup_cross_entropy_steps,
        cfg.warmup_batch_size,
        dataclasses.replace(cfg, lr=cfg.warmup_lr or cfg.lr),
        cfg.seed,
        done=reached if until is not None else None,
        check_every=10,
    )
    print(f"warm-up: {details['warmup_steps']} steps in {details['warmup_seconds']:.0f} s")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def bench_recipe(
    recipe: Recipe, model_dir: Path, sync_mode: str, steps: int, path: Path, validate_every: int = 25, seed: int | None = None
) -> Path:
    values = recipe.to_dict()
    values["environment"]["setup_script"] = None
    values["rollout_worker"]["model_path"] = str(model_dir)
    values["trainer"].update(warmup_cross_entropy_steps=0, warmup_until_accuracy=None, total_train_steps=steps)
    if seed is not None:
        values["trainer"]["seed"] = seed
        values["data"]["seed"] = seed
    values["weight"]["sync_mode"] = sync_mode
    values["validate"]["eval"]["compute_interval"] = validate_every
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(values), path)
    return path


def run_streamrl(recipe: Recipe, task: Task, model_dir: Path, sync_mode: str, seed: int) -> dict:
    name = f"tta-{task.recipe.parent.name}-{sync_mode}-s{seed}-{time.strftime('%H%M%S')}"
    path = bench_recipe(recipe, model_dir, sync_mode, task.steps, OUT / f"{name}.yaml", task.validate_every, seed)
    started_wall = time.time()
    run = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "run", str(path), "--run", name, "--out", str(OUT / name)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    marks: list[tuple[int, dict]] = []  # (steps done, CPU by role): from step 2 to the last seen
    settings = Settings.from_env()
    meter = CpuMeter(name)
    with connect(settings.database_url, autocommit=True) as conn:
        while run.poll() is None:
            cpu = meter.read()  # at every poll: the learner ends after its last step, maybe before the next poll
            done = conn.execute("select count(*) from train_steps where run_id = %s", (name,)).fetchone()[0]
            if done >= 2 and (not marks or done > marks[-1][0]):
                marks = [*marks[:1], (done, cpu)]
            time.sleep(0.2)
        if run.returncode:
            raise RuntimeError(f"streamrl run {name} failed ({run.returncode}): see {OUT / name}")
        rows = conn.execute(
            "select step, avg(reward), count(*), extract(epoch from max(created_at)) from evaluations "
            "where run_id = %s and is_val group by step order by step",
            (name,),
        ).fetchall()
    total = time.time() - started_wall
    val_rows = recipe.validate.data.max_rows
    curve = [(float(ts) - started_wall, int(step), float(acc)) for step, acc, count, ts in rows if count >= val_rows]
    cpu = per_step(marks[0][1], marks[-1][1], marks[-1][0] - marks[0][0]) if len(marks) == 2 else {}
    return {
        "system": f"streamrl-{sync_mode}",
        "seed": seed,
        "run": name,
        "curve": curve,
        "wall_s": total,
        "cpu_per_step_s": cpu,
        "time_to_target_s": next((t for t, _, acc in curve if acc >= task.target), None),
    }


def run_trl_process(task: Task, model_dir: Path, seed: int) -> dict:
    """TRL in a process of its own, its clock started at launch (bench/tta_trl.py)."""
    result = OUT / f"trl-{task.recipe.parent.name}-s{seed}.json"
    launched = time.time()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "tta_trl.py"),
            "--recipe",
            str(task.recipe),
            "--model-dir",
            str(model_dir),
            "--steps",
            str(task.steps),
            "--target",
            str(task.target),
            "--validate-every",
            str(task.validate_every),
            "--seed",
            str(seed),
            "--out",
            str(OUT),
            "--launched",
            repr(launched),
            "--result",
            str(result),
        ],
        check=True,
        cwd=ROOT,
    )
    return json.loads(result.read_text())


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 4), squeeze=False)
    for ax, (task_name, runs) in zip(axes[0], results.items()):
        for result in runs:
            ax.plot(
                [t for t, _, _ in result["curve"]],
                [a for _, _, a in result["curve"]],
                marker=".",
                label=f"{result['system']} s{result['seed']}",
            )
        ax.axhline(TASKS[task_name].target, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(f"{task_name}: same warmed model, data and hyper-parameters")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(task_name: str, runs: list[dict]) -> None:
    """Median time to target per system over seeds, and its ratio to TRL's median."""
    task = TASKS[task_name]
    medians = {}
    for system in dict.fromkeys(r["system"] for r in runs):
        times = [r["time_to_target_s"] for r in runs if r["system"] == system]
        medians[system] = median(times) if all(t is not None for t in times) else None
    trl = medians.get("trl-grpo")
    table = Table(title=f"{task_name}: time to {task.target} held-out accuracy (median over seeds)")
    for column in ("system", "seconds per seed", "median", "vs TRL", "target", "met", "step split a step (s)"):
        table.add_column(column)
    for system, seconds in medians.items():
        ratio = seconds / trl if trl and seconds else None
        goal = task.ratio_targets.get(system)
        split = next(r.get("step_split_s") or r.get("cpu_per_step_s") for r in runs if r["system"] == system)
        per_seed = ", ".join(
            "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
            for r in runs
            if r["system"] == system
        )
        table.add_row(
            system,
            per_seed,
            "not reached" if seconds is None else f"{seconds:.0f}",
            "" if ratio is None else f"{ratio:.2f}x",
            "" if goal is None else f"<= {goal}x",
            "" if goal is None else ("yes" if ratio is not None and ratio <= goal else "no"),
            " ".join(f"{k} {v:.3f}" for k, v in sorted(split.items(), key=lambda kv: -kv[1])),
        )
        for r in runs:
            if r["system"] == system:
                r["ratio_vs_trl_median"] = ratio
    Console(width=180).print(table)


def systems(wanted: list[str]) -> set[str]:
    return {"trl-grpo" if name == "trl" else f"streamrl-{name}" for name in wanted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="shift,arith")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per system (shift); arith runs one")
    parser.add_argument("--only", default="fully-async,batch-async,sync,trl")
    args = parser.parse_args()
    os.environ.setdefault("STREAMRL_HOME", str(ROOT / "bench" / "out" / "home"))
    subprocess.run([sys.executable, "-m", "streamrl.cli", "up"], check=True, cwd=ROOT, capture_output=True)
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = args.only.split(",")
    saved = OUT.parent / "time_to_accuracy.json"
    # one file for both tasks: a run of one task keeps the other's latest results
    results: dict[str, list[dict]] = json.loads(saved.read_text()) if saved.exists() else {}
    for task_name in args.tasks.split(","):
        task = TASKS[task_name]
        recipe = prepare_recipe(task.recipe)
        model_dir = warmed_model(
            recipe, OUT / ("warm_model" if task_name == "arith" else f"warm_model_{task_name}"), task.warm_until
        )
        # systems left out this time keep their latest results
        runs = results[task_name] = [r for r in results.get(task_name, []) if r["system"] not in systems(wanted)]
        for seed in range(1, (args.seeds if task_name == "shift" else 1) + 1):
            for mode in ("fully-async", "batch-async", "sync"):
                if mode in wanted:
                    runs.append(run_streamrl(recipe, task, model_dir, mode, seed))
            if "trl" in wanted:
                runs.append(run_trl_process(task, model_dir, seed))
        report(task_name, runs)
        saved.write_text(json.dumps(results, indent=2))
        plot({name: runs for name, runs in results.items() if name in TASKS}, OUT.parent / "time_to_accuracy.png")
    print(f"curves: {OUT.parent / 'time_to_accuracy.png'}")


if __name__ == "__main__":
    main()
