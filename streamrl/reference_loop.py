"""One GRPO run in one process, top to bottom: what `streamrl run` does across five
processes and the broker, written as one loop over the same functions.

    python -m streamrl.reference_loop RECIPE [key=value ...] [--steps N] [--out DIR]

Each step, in order (the file:function each hop runs in a distributed run is in
docs/anatomy.md):

    1. tasks        the step's prompts, each repeated rollout_repeat_n times (publisher)
    2. sampling     every completion from its own generator, seeded by the run's seed and
                    the task's identity (rollout worker; algos/sampling.py)
    3. reward       the recipe's evaluator on each answer (rollout worker)
    4. advantages   each group's rewards through the estimator; a group whose rewards are
                    all equal is filtered (stream processor; algos/advantages.py)
    5. loss, step   the trainer's loss over the step's samples in trajectory-id order, one
                    AdamW step at the step's learning rate (learner; algos/losses.py)
    6. version      the weights the next step samples with (learner -> rollout workers)

In sync mode (`weight.sync_mode: sync`) a distributed run computes exactly this: the
test tests/test_reference_loop.py holds it to the same weights after every step. The
loop is for reading and for checking; it has no broker, ledger, restarts, validation
rollouts or other workers, and refuses a recipe whose training it would not reproduce.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from streamrl.runtime.quiet import quiet_library_progress

quiet_library_progress()  # before transformers is imported: it reads the variables then

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.algos.advantages import advantage_scope, group_advantages, is_zero_variance
from streamrl.algos.lr_schedule import learning_rate_at
from streamrl.algos.sampling import decode, request_seed, row_generators
from streamrl.learner.batching import TrainItem
from streamrl.learner.checkpoint import write_weight_version
from streamrl.learner.remote_trainers import trainer_class
from streamrl.learner.trainer_factory import build_trainer
from streamrl.learner.trainers import Trainer, plan_step
from streamrl.learner.version_writes import cpu_copy
from streamrl.learner.warmup import cross_entropy_warmup, greedy_exact_match, supervised_items
from streamrl.producers.evaluator import BaseEvaluationTarget, run_evaluator
from streamrl.producers.publisher import step_tasks
from streamrl.producers.rollout import seed_key
from streamrl.producers.worker_loop import make_evaluator
from streamrl.runtime.chat_template import ChatRenderer, padding_id, recipe_renderer
from streamrl.runtime.config import Recipe
from streamrl.runtime.dataset import epoch_batches, total_train_steps, training_rows, validation_rows
from streamrl.runtime.folders import directory_sha256
from streamrl.runtime.recipe import prepare_recipe
from streamrl.runtime.threads import learner_threads


@dataclasses.dataclass
class StepRecord:
    """What the ledger's train_steps row of the same step holds, and the weights after it."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    samples: int
    groups_filtered: int
    reward_mean: float
    metrics: dict[str, float]
    weights_sha256: str


def check_reproducible(recipe: Recipe) -> None:
    """The loop reproduces the self-hosted, single-turn, group-scope GRPO family; it says
    so rather than train something else under the recipe's name."""
    worker, trainer = recipe.rollout_worker, recipe.trainer
    problems = [
        "rollout_worker.type must be single_turn" if worker.type not in ("single_turn", "simple") else "",
        "custom rollout workers are not reproduced" if worker.custom_rollout_worker_module_path else "",
        "trainer.type must be grpo" if trainer.type != "grpo" else "",
        "trainer.nproc_per_node must be 1" if trainer.nproc_per_node != 1 else "",
        "trainer.lora is not reproduced" if trainer.lora else "",
        "algorithm.use_kl_loss / use_kl_in_reward are not reproduced"
        if recipe.algorithm.use_kl_loss or recipe.algorithm.use_kl_in_reward
        else "",
        "trainer.warmup_messages_key is not reproduced" if trainer.warmup_messages_key else "",
        "algorithm.type must be a group-scope estimator" if advantage_scope(recipe.algorithm.type) != "group" else "",
        "algorithm.credit_assignment must be episode" if recipe.algorithm.credit_assignment != "episode" else "",
        "custom advantage modules are not reproduced" if recipe.algorithm.custom_advantage_module_path else "",
    ]
    problems = [p for p in problems if p]
    if problems:
        raise ValueError("the reference loop cannot reproduce this recipe: " + "; ".join(problems))


def warm_up(recipe: Recipe, model, tokenizer, renderer: ChatRenderer, val_rows: list[dict]) -> dict:
    """The learner's cross-entropy warm-up (learner/policy.py: Policy.warm_up), same calls."""
    cfg, data = recipe.trainer, recipe.data
    rows = training_rows(data, (data.prompt_key, data.answer_key))
    items = supervised_items(rows, renderer, data.prompt_key, data.answer_key)
    max_new = recipe.rollout_worker.max_response_length

    def accuracy() -> float:
        return greedy_exact_match(model, renderer, val_rows, recipe.validate.data.prompt_key, data.answer_key, max_new)

    target = cfg.warmup_until_accuracy
    done = (lambda: accuracy() >= target) if target is not None else None
    warm_cfg = dataclasses.replace(cfg, lr=cfg.warmup_lr or cfg.lr)
    return cross_entropy_warmup(
        model, tokenizer, items, cfg.warmup_cross_entropy_steps, cfg.warmup_batch_size, warm_cfg, cfg.seed,
        done=done, check_every=cfg.warmup_check_every,
    )  # fmt: skip


def rollout_step(recipe: Recipe, sampler, tokenizer, renderer, evaluator, step: int, rows: list[dict]):
    """Steps 1-4: the step's samples as TrainItems (trajectory-id order) and the number
    of groups filtered for equal rewards."""
    worker = recipe.rollout_worker
    tasks = step_tasks("reference", step, rows, worker.rollout_repeat_n, recipe.data.prompt_key, 0)
    prompts = [renderer.prompt_ids(task.prompt) for task in tasks]
    seeds = [request_seed(recipe.trainer.seed, f"{seed_key(task, worker.max_retries)}/0") for task in tasks]
    sampler.eval()
    completions = decode(
        sampler, prompts, max_new_tokens=worker.max_response_length, temperature=worker.temperature,
        top_p=worker.top_p, stop_ids={tokenizer.eos_token_id}, pad_id=padding_id(tokenizer),
        generator=row_generators(seeds),
    )  # fmt: skip
    rewards = [
        run_evaluator(
            evaluator, task.data, BaseEvaluationTarget(tokenizer.decode(out.tokens, skip_special_tokens=True))
        ).result.reward
        for task, out in zip(tasks, completions)
    ]
    items, filtered = [], 0
    for start in range(0, len(tasks), worker.rollout_repeat_n):
        group = range(start, start + worker.rollout_repeat_n)
        group_rewards = np.array([rewards[i] for i in group], dtype=np.float64)
        if recipe.algorithm.filter_zero_variance and len(group) > 1 and is_zero_variance(group_rewards):
            filtered += 1
            continue
        advantages = group_advantages(recipe.algorithm.type, group_rewards, recipe.algorithm.grpo_std_epsilon)
        for i, advantage in zip(group, advantages):
            prompt, response = prompts[i], completions[i].tokens
            items.append(
                TrainItem(
                    tokens=np.array(prompt + response, dtype=np.int32),
                    mask=np.array([0] * len(prompt) + [1] * len(response), dtype=np.uint8),
                    behaviour_logprobs=np.array([0.0] * len(prompt) + completions[i].logprobs, dtype=np.float32),
                    advantage=float(advantage),
                    weight_version=step - 1,
                    trajectory_id=tasks[i].task_id,
                    reward=rewards[i],
                    group_id=tasks[i].group_id,
                )
            )
    return sorted(items, key=lambda item: item.trajectory_id), filtered


def train_step(trainer: Trainer, items: list[TrainItem], lr: float):
    """Step 5, as the learner's Policy.train does it with one process."""
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr
    prepared, _ = trainer.prepare(items)
    plan = plan_step(prepared, 1, trainer.micro_batches)
    return trainer.train(plan.shares[0], plan.totals, plan.rounds)


def run(recipe: Recipe, steps: int | None = None, out: Path | None = None, on_step=None) -> list[StepRecord]:
    check_reproducible(recipe)
    torch.set_num_threads(learner_threads(recipe))  # the learner's threads: its sums in the same order
    folder = recipe.rollout_worker.model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    sampler = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)  # the worker's copy
    renderer = recipe_renderer(recipe, tokenizer)
    evaluator = make_evaluator(recipe)
    val = recipe.validate.data
    val_rows = validation_rows(val.data_files, val.type, val.max_rows)
    if recipe.trainer.warmup_cross_entropy_steps:
        warm_up(recipe, model, tokenizer, renderer, val_rows)
    trainer = build_trainer(trainer_class(recipe), recipe, model, padding_id(tokenizer))
    total = total_train_steps(recipe)
    steps = total if steps is None else min(steps, total)
    data, cfg = recipe.data, recipe.trainer
    rows = training_rows(data, prompt_keys=(data.prompt_key,))
    batches = epoch_batches(rows, recipe.trajectory_pool.batch_size, data.shuffle, data.seed)
    out = out or Path("reference-weights")
    records = []
    for step in range(1, steps + 1):
        sampler.load_state_dict(model.state_dict())  # step 6 of the step before: version step - 1
        _, batch = next(batches)
        items, filtered = rollout_step(recipe, sampler, tokenizer, renderer, evaluator, step, batch)
        lr = learning_rate_at(step, total, cfg.lr, cfg.lr_schedule, cfg.min_lr_ratio, cfg.lr_warmup_steps)
        result = train_step(trainer, items, lr) if items else None
        version = write_weight_version(out, step, model, tokenizer, cpu_copy(model.state_dict()))
        record = StepRecord(
            step=step,
            loss=result.loss if result else 0.0,
            grad_norm=result.grad_norm if result else 0.0,
            lr=lr,
            samples=len(items),
            groups_filtered=filtered,
            reward_mean=float(np.mean([i.reward for i in items])) if items else 0.0,
            metrics=dict(result.metrics) if result else {},
            weights_sha256=directory_sha256(version),
        )
        records.append(record)
        if on_step:
            on_step(record)
    if val_rows:
        max_new = recipe.rollout_worker.max_response_length
        accuracy = greedy_exact_match(model, renderer, val_rows, val.prompt_key, data.answer_key, max_new)
        print(f"held-out greedy accuracy after {steps} steps: {accuracy:.3f} ({len(val_rows)} rows)")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key.path=value, as `streamrl run` takes them")
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: the recipe's)")
    parser.add_argument("--out", type=Path, help="folder for the weights after each step (default: ./reference-weights)")
    args = parser.parse_args()
    recipe = prepare_recipe(args.recipe, overrides=args.overrides)

    def show(record: StepRecord) -> None:
        loss = "-" if math.isnan(record.loss) else f"{record.loss:.5f}"
        print(
            f"step {record.step:4d}  reward {record.reward_mean:.3f}  loss {loss}  "
            f"samples {record.samples:4d}  weights {record.weights_sha256[:12]}"
        )

    run(recipe, args.steps, args.out, on_step=show)


if __name__ == "__main__":
    main()
