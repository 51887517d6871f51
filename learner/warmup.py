"""The cross-entropy warm-up that may precede RL, and a quick greedy check of what it
achieved (run in the learner, before the first weight version exists)."""

from __future__ import annotations

import time

import numpy as np
import torch

from streamrl.learner.batching import TrainItem
from streamrl.learner.parallel import Placement
from streamrl.learner.trainers import CrossEntropyTrainer, plan_step
from streamrl.runtime.chat_template import ChatRenderer, demonstration_tokens, padding_id, stop_token_ids
from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.dataset import lookup


def demonstration_items(rows: list[dict], renderer: ChatRenderer, messages_key: str) -> list[TrainItem]:
    """Multi-turn demonstrations (a list of chat messages per row): only the assistant's
    turns train, laid out exactly as the agent loop lays out its episodes (the model's
    chat template between the assistant turns)."""
    items = []
    for i, row in enumerate(rows):
        if not isinstance(lookup(row, messages_key), list):
            raise ValueError(f"warm-up row {i}: {messages_key!r} must be a list of chat messages")
        tokens, mask = demonstration_tokens(renderer, lookup(row, messages_key))
        items.append(
            TrainItem(
                tokens=np.array(tokens, dtype=np.int32),
                mask=np.array(mask, dtype=np.uint8),
                behaviour_logprobs=np.zeros(len(tokens), np.float32),
            )
        )
    return items


def supervised_items(rows: list[dict], renderer: ChatRenderer, prompt_key: str, answer_key: str) -> list[TrainItem]:
    """Prompt (as the rollouts send it), then answer and the end of the turn; only the
    answer and its end train."""
    items = []
    tokenizer = renderer.tokenizer
    for row in rows:
        prompt = renderer.prompt_ids(lookup(row, prompt_key))
        answer = tokenizer(str(lookup(row, answer_key)), add_special_tokens=False)["input_ids"] + [renderer.turn_end_id()]
        tokens = np.array(prompt + answer, dtype=np.int32)
        mask = np.array([0] * len(prompt) + [1] * len(answer), dtype=np.uint8)
        items.append(TrainItem(tokens=tokens, mask=mask, behaviour_logprobs=np.zeros(len(tokens), np.float32)))
    return items


@torch.no_grad()
def greedy_exact_match(
    model, renderer: ChatRenderer, rows: list[dict], prompt_key: str, answer_key: str, max_new_tokens: int = 16
) -> float:
    """Fraction of rows whose greedy completion, stripped, equals the answer."""
    if not rows:
        return float("nan")
    model.eval()
    tokenizer = renderer.tokenizer
    prompts = [renderer.prompt_ids(lookup(r, prompt_key)) for r in rows]
    width = max(len(p) for p in prompts)
    pad = padding_id(tokenizer)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=stop_token_ids(tokenizer),
    )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return float(np.mean([t.strip() == str(lookup(r, answer_key)).strip() for t, r in zip(texts, rows)]))


def cross_entropy_warmup(
    model,
    tokenizer,
    items: list[TrainItem],
    steps: int,
    batch_size: int,
    trainer_config: TrainerConfig,
    seed: int,
    placement: Placement | None = None,
    done=None,
    check_every: int = 0,
) -> dict:
    """At most `steps` steps of cross-entropy on batches drawn with `seed` (the same
    batches on every rank; each rank trains its share of each); with `done`, it is asked
    every `check_every` steps whether to stop (on every rank: it may be collective)."""
    trainer = CrossEntropyTrainer(model, padding_id(tokenizer), trainer_config, placement=placement)
    rank, world = trainer.placement.rank, trainer.placement.world_size
    rng = np.random.default_rng(seed)
    started, losses = time.perf_counter(), []
    for step in range(1, steps + 1):
        batch = [items[i] for i in rng.integers(0, len(items), batch_size)]
        plan = plan_step(batch, world, trainer.micro_batches)
        losses.append(trainer.train(plan.shares[rank], plan.totals, plan.rounds).loss)
        if done is not None and step % check_every == 0 and step < steps and done():
            break
    return {
        "warmup_steps": len(losses),
        "warmup_first_loss": losses[0],
        "warmup_last_loss": float(np.mean(losses[-10:])),
        "warmup_seconds": time.perf_counter() - started,
    }
