"""Time to 0.9 held-out accuracy: StreamRL (sync and fully-async) vs TRL's GRPOTrainer.

All three start from the same model: the built-in recipe's tiny Qwen2 after the
recipe's own cross-entropy warm-up, done once here and saved. Each then runs GRPO on
the same data with the same hyper-parameters (32 prompts x 8 samples per step, lr with
the same cosine decay, clip 0.2 / 0.28, no KL, token-mean loss, group-normalised
advantages, temperature 1, at most 4 new tokens) and is scored on the same 200 held-out
prompts with greedy decoding every 25 steps.

The clock:
- StreamRL: from launching `streamrl run` (process start-up, topic creation and model
  loading included) to the moment the ledger holds the last validation result of the
  first version at or above the target.
- TRL: from building the GRPOTrainer to the end of the first step whose greedy check
  reaches the target, minus the time spent in those checks (StreamRL's workers score
  validation prompts alongside training, so TRL is not charged for its own).

Prints a table with the ratios against TRL and the targets (fully-async <= 1.0x,
sync <= 1.5x), and writes bench/out/time_to_accuracy.{json,png}.

    python bench/time_to_accuracy.py [--steps 400] [--target 0.9] [--only streamrl-sync,trl]

Needs the bench extra (`pip install -e '.[bench]'`, which `make bench` does) for TRL,
and the embedded services (`streamrl up`, started here if they are not running).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from learner.warmup import cross_entropy_warmup, greedy_exact_match, supervised_items  # noqa: E402
from runtime.chat_template import recipe_renderer  # noqa: E402
from producers.evaluator import BaseEvaluationTarget, run_evaluator  # noqa: E402
from producers.worker_loop import make_evaluator  # noqa: E402
from runtime.config import Recipe  # noqa: E402
from runtime.dataset import read_rows  # noqa: E402
from runtime.db import connect  # noqa: E402
from runtime.recipe import prepare_recipe  # noqa: E402
from runtime.settings import Settings  # noqa: E402
from runtime.tiny_lm import load  # noqa: E402

RECIPE = ROOT / "recipes" / "arith" / "recipe.yaml"
OUT = ROOT / "bench" / "out" / "time_to_accuracy"
VALIDATE_EVERY = 25
TARGETS = {"streamrl-fully-async": 1.0, "streamrl-sync": 1.5}


def warmed_model(recipe: Recipe, directory: Path) -> Path:
    """The recipe's cross-entropy warm-up, once, saved for every contender."""
    if (directory / "config.json").exists():
        return directory
    cfg, data = recipe.trainer, recipe.data
    torch.manual_seed(cfg.seed)
    tokenizer, model = load(recipe.rollout_worker.model_path)
    rows = read_rows(data.data_files, data.type, [data.prompt_key, data.answer_key])
    items = supervised_items(rows, recipe_renderer(recipe, tokenizer), data.prompt_key, data.answer_key)
    cross_entropy_warmup(model, tokenizer, items, cfg.warmup_cross_entropy_steps, cfg.warmup_batch_size,
                         dataclasses.replace(cfg, lr=cfg.warmup_lr or cfg.lr), cfg.seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def bench_recipe(recipe: Recipe, model_dir: Path, sync_mode: str, steps: int, path: Path) -> Path:
    values = recipe.to_dict()
    values["environment"]["setup_script"] = None
    values["rollout_worker"]["model_path"] = str(model_dir)
    values["trainer"].update(warmup_cross_entropy_steps=0, total_train_steps=steps)
    values["weight"]["sync_mode"] = sync_mode
    values["validate"]["eval"]["compute_interval"] = VALIDATE_EVERY
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(values), path)
    return path


def run_streamrl(recipe: Recipe, model_dir: Path, sync_mode: str, steps: int, target: float, val_rows: int) -> dict:
    name = f"tta-{sync_mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = bench_recipe(recipe, model_dir, sync_mode, steps, OUT / f"{name}.yaml")
    started_wall = time.time()
    subprocess.run([sys.executable, "-m", "streamrl.cli", "run", str(path), "--run", name, "--out", str(OUT / name)],
                   check=True, cwd=ROOT)
    total = time.time() - started_wall
    with connect(Settings.from_env().database_url, autocommit=True) as conn:
        rows = conn.execute(
            "select step, avg(reward), count(*), extract(epoch from max(created_at)) from evaluations "
            "where run_id = %s and is_val group by step order by step", (name,)).fetchall()
    curve = [(float(ts) - started_wall, int(step), float(acc)) for step, acc, count, ts in rows if count >= val_rows]
    return {"system": f"streamrl-{sync_mode}", "run": name, "curve": curve, "wall_s": total,
            "time_to_target_s": next((t for t, _, acc in curve if acc >= target), None)}


def run_trl(recipe: Recipe, model_dir: Path, steps: int, target: float) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data, worker, cfg, algo = recipe.data, recipe.rollout_worker, recipe.trainer, recipe.algorithm
    val_cfg = recipe.validate.data
    prompt_key, answer_key = data.prompt_key, data.answer_key
    train = read_rows(data.data_files, data.type, [prompt_key, answer_key])
    val = read_rows(val_cfg.data_files, data.type, [prompt_key, answer_key])[:val_cfg.max_rows or None]
    evaluator = make_evaluator(recipe)

    def recipe_reward(prompts, completions, answer, **_):
        # The recipe's own evaluator, so both systems are rewarded by the same code.
        return [run_evaluator(evaluator, {answer_key: a}, BaseEvaluationTarget(final_answer=c)).result.reward
                for c, a in zip(completions, answer)]

    dataset = Dataset.from_list([{"prompt": str(r[prompt_key]), "answer": str(r[answer_key])} for r in train])
    tokenizer, model = load(model_dir)
    group = worker.rollout_repeat_n
    args = GRPOConfig(
        output_dir=str(OUT / "trl"), max_steps=steps, per_device_train_batch_size=recipe.trajectory_pool.batch_size * group,
        num_generations=group, max_completion_length=worker.max_response_length, temperature=worker.temperature,
        top_p=worker.top_p, learning_rate=cfg.lr, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio}, warmup_steps=cfg.lr_warmup_steps,
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.grad_clip, beta=0.0, epsilon=algo.clip_ratio_low,
        epsilon_high=algo.clip_ratio_high, loss_type="dapo", scale_rewards="group", num_iterations=1,
        # TRL's defaults are bf16 autocast and gradient checkpointing: on a CPU without
        # bf16 units both only slow it down, and StreamRL trains in float32 without them.
        bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=VALIDATE_EVERY, seed=cfg.seed,
        disable_tqdm=False,
    )
    curve: list[tuple[float, int, float]] = []
    clock = {"start": 0.0, "eval": 0.0}

    class GreedyCheck(TrainerCallback):
        def check(self, step, model):
            began = time.perf_counter()
            acc = greedy_exact_match(model, recipe_renderer(recipe, tokenizer), val, prompt_key, answer_key,
                                     worker.max_response_length)
            model.train()
            clock["eval"] += time.perf_counter() - began
            curve.append((time.perf_counter() - clock["start"] - clock["eval"], step, acc))
            return acc

        def on_train_begin(self, args, state, control, model=None, **_):
            self.check(0, model)

        def on_step_end(self, args, state, control, model=None, **_):
            if state.global_step % VALIDATE_EVERY == 0 and self.check(state.global_step, model) >= target:
                control.should_training_stop = True

    clock["start"] = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=recipe_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[GreedyCheck()])
    trainer.train()
    return {"system": "trl-grpo", "curve": curve, "wall_s": time.perf_counter() - clock["start"],
            "time_to_target_s": next((t for t, _, acc in curve if acc >= target), None)}


def plot(results: list[dict], target: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for result in results:
        ax.plot([t for t, _, _ in result["curve"]], [a for _, _, a in result["curve"]], marker="o", label=result["system"])
    ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("time to target accuracy, same model, data and hyper-parameters")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="GRPO steps at most, per system")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--only", default="streamrl-fully-async,streamrl-sync,trl")
    args = parser.parse_args()
    os.environ.setdefault("STREAMRL_HOME", str(ROOT / "bench" / "out" / "home"))
    subprocess.run([sys.executable, "-m", "streamrl.cli", "up"], check=True, cwd=ROOT, capture_output=True)
    OUT.mkdir(parents=True, exist_ok=True)
    recipe = prepare_recipe(RECIPE)
    model_dir = warmed_model(recipe, OUT / "warm_model")
    val_rows = recipe.validate.data.max_rows
    wanted = args.only.split(",")
    results = []
    for mode in ("fully-async", "sync"):
        if f"streamrl-{mode}" in wanted:
            results.append(run_streamrl(recipe, model_dir, mode, args.steps, args.target, val_rows))
    if "trl" in wanted:
        results.append(run_trl(recipe, model_dir, args.steps, args.target))

    trl = next((r for r in results if r["system"] == "trl-grpo"), None)
    table = Table(title=f"time to {args.target} held-out accuracy (from the same warmed model)")
    for column in ("system", "time to target (s)", "vs TRL", "target", "met", "start acc", "best acc"):
        table.add_column(column)
    for result in results:
        seconds = result["time_to_target_s"]
        ratio = seconds / trl["time_to_target_s"] if (trl and trl["time_to_target_s"] and seconds) else None
        goal = TARGETS.get(result["system"])
        met = "" if goal is None or ratio is None else ("yes" if ratio <= goal else "no")
        accs = [a for _, _, a in result["curve"]]
        table.add_row(result["system"], "not reached" if seconds is None else f"{seconds:.0f}",
                      "" if ratio is None else f"{ratio:.2f}x", "" if goal is None else f"<= {goal}x", met,
                      f"{accs[0]:.3f}" if accs else "", f"{max(accs):.3f}" if accs else "")
        result["ratio_vs_trl"] = ratio
    Console().print(table)
    (OUT.parent / "time_to_accuracy.json").write_text(json.dumps(results, indent=2))
    plot(results, args.target, OUT.parent / "time_to_accuracy.png")
    print(f"curves: {OUT.parent / 'time_to_accuracy.png'}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
