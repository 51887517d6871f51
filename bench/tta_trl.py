"""TRL's side of bench/time_to_accuracy.py: GRPOTrainer on a recipe's data and
hyper-parameters, scored on the held-out rows as the recipe's validation scores them,
with its step time split into generation (and scoring) and training.

Run as a script (what the benchmark does), it is a process of its own whose clock
starts when the benchmark launches it, as StreamRL's starts when `streamrl run` is
launched: both pay for starting Python, importing torch and their libraries, and
loading the model.

    python bench/tta_trl.py --recipe R --model-dir M --steps N --target A --validate-every K
                            --seed S --out DIR --launched EPOCH --result FILE.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import numpy as np
import torch

from streamrl.producers.evaluator import BaseEvaluationTarget, run_evaluator
from streamrl.producers.worker_loop import make_evaluator
from streamrl.runtime.chat_template import recipe_renderer, stop_token_ids
from streamrl.runtime.config import Recipe
from streamrl.runtime.dataset import lookup, read_rows
from streamrl.runtime.tiny_lm import load


@torch.no_grad()
def heldout_score(model, recipe: Recipe, tokenizer, rows: list[dict], evaluator, seed: int) -> float:
    """Mean reward of the recipe's evaluator on the held-out rows, sampled at the
    validation temperature (greedy at 0): what StreamRL's workers report as validation."""
    model.eval()
    worker, data, temperature = recipe.rollout_worker, recipe.data, recipe.validate.temperature
    renderer = recipe_renderer(recipe, tokenizer)
    prompts = [renderer.prompt_ids(lookup(r, data.prompt_key)) for r in rows]
    width, pad = max(len(p) for p in prompts), tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0 else {"do_sample": False}
    )
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        max_new_tokens=worker.max_response_length,
        pad_token_id=pad,
        eos_token_id=stop_token_ids(tokenizer),
        **sampling,
    )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    model.train()
    return float(
        np.mean(
            [
                run_evaluator(evaluator, row, BaseEvaluationTarget(final_answer=text)).result.reward
                for text, row in zip(texts, rows)
            ]
        )
    )


def run_trl(
    recipe: Recipe,
    model_dir: Path,
    steps: int,
    target: float,
    validate_every: int,
    seed: int,
    out: Path,
    launched: float | None = None,
) -> dict:
    """`launched` (epoch seconds): the curve's times count from then, not from building
    the trainer."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data, worker, cfg, algo = recipe.data, recipe.rollout_worker, recipe.trainer, recipe.algorithm
    val_cfg = recipe.validate.data
    prompt_key, answer_key = data.prompt_key, data.answer_key
    train = read_rows(data.data_files, data.type, [prompt_key, answer_key])
    val = read_rows(val_cfg.data_files, data.type, [prompt_key, answer_key])[: val_cfg.max_rows or None]
    evaluator = make_evaluator(recipe)

    def recipe_reward(prompts, completions, answer, **_):
        # The recipe's own evaluator, so both systems are rewarded by the same code.
        return [
            run_evaluator(evaluator, {answer_key: a}, BaseEvaluationTarget(final_answer=c)).result.reward
            for c, a in zip(completions, answer)
        ]

    dataset = Dataset.from_list([{"prompt": str(r[prompt_key]), "answer": str(r[answer_key])} for r in train])
    tokenizer, model = load(model_dir)
    group = worker.rollout_repeat_n
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        max_steps=steps,
        per_device_train_batch_size=recipe.trajectory_pool.batch_size * group,
        num_generations=group,
        max_completion_length=worker.max_response_length,
        temperature=worker.temperature,
        top_p=worker.top_p,
        learning_rate=cfg.lr,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio},
        warmup_steps=cfg.lr_warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.grad_clip,
        beta=0.0,
        epsilon=algo.clip_ratio_low,
        epsilon_high=algo.clip_ratio_high,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        # TRL's defaults are bf16 autocast and gradient checkpointing: on a CPU without
        # bf16 units both only slow it down, and StreamRL trains in float32 without them.
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=validate_every,
        seed=seed,
        disable_tqdm=True,
    )
    curve: list[tuple[float, int, float]] = []
    clock = {"start": 0.0, "eval": 0.0, "generate": 0.0, "step_began": 0.0, "steps": 0.0, "step_count": 0}

    class HeldOutCheck(TrainerCallback):
        def check(self, step, model):
            began = time.perf_counter()
            score = heldout_score(model, recipe, tokenizer, val, evaluator, seed + step)
            clock["eval"] += time.perf_counter() - began
            since = time.time() - launched if launched is not None else time.perf_counter() - clock["start"]
            curve.append((since - clock["eval"], step, score))
            return score

        def on_train_begin(self, args, state, control, model=None, **_):
            self.check(0, model)

        def on_step_begin(self, args, state, control, **_):
            clock["step_began"] = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **_):
            clock["steps"] += time.perf_counter() - clock["step_began"]
            clock["step_count"] += 1
            if state.global_step % validate_every == 0 and self.check(state.global_step, model) >= target:
                control.should_training_stop = True

    clock["start"] = time.perf_counter()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=recipe_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[HeldOutCheck()],
    )
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(*a, **k):  # the rollout half of a TRL step
        began = time.perf_counter()
        try:
            return generate_and_score(*a, **k)
        finally:
            clock["generate"] += time.perf_counter() - began

    trainer._generate_and_score_completions = timed_generate_and_score
    trainer.train()
    count = max(clock["step_count"], 1)
    split = {
        "step": clock["steps"] / count,
        "generation + scoring": clock["generate"] / count,
        "training": (clock["steps"] - clock["generate"]) / count,
    }
    return {
        "system": "trl-grpo",
        "seed": seed,
        "curve": curve,
        "wall_s": time.perf_counter() - clock["start"],
        "threads": torch.get_num_threads(),
        "step_split_s": split,
        "time_to_target_s": next((t for t, _, acc in curve if acc >= target), None),
    }


def main() -> None:
    import argparse
    import json

    from streamrl.runtime.recipe import prepare_recipe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--recipe", "--model-dir", "--out", "--result"):
        parser.add_argument(name, type=Path, required=True)
    for name in ("--steps", "--validate-every", "--seed"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--target", type=float, required=True)
    parser.add_argument("--launched", type=float, required=True, help="when the benchmark started this process")
    args = parser.parse_args()
    result = run_trl(
        prepare_recipe(args.recipe),
        args.model_dir,
        args.steps,
        args.target,
        args.validate_every,
        args.seed,
        args.out,
        launched=args.launched,
    )
    args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
