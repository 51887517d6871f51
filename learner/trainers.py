"""Trainers: one optimizer step from a list of TrainItems.

    GRPOTrainer          PPO-clip policy gradient against the behaviour logprobs, with
                         optional off-policy correction, KL to a frozen reference, entropy
    CrossEntropyTrainer  supervised (SFT) loss on the masked tokens, for warm-up
    custom               a subclass loaded from `trainer.custom_trainer_module_path`
                         ("file.py:Class") that overrides either hook of the guide:
                         `_prepare_trajectories(trajectories, metrics)` on the step's
                         samples as a list (re-derive advantages, re-weight, log), or
                         `_prepare_batch(items)` just before the loss

Every loss is summed over micro-batches with the *whole* batch's token and sequence
counts (learner/losses.py), so micro-batching never changes the gradient.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from algos.advantages import get_advantage_estimator
from algos.kl import kl_penalty, kl_reward_to_go, make_kl_controller
from algos.losses import POLICY_LOSSES, aggregate_loss, entropy_from_logits, token_logprobs
from learner.batching import TrainItem, collate, micro_batches_by_tokens
from runtime.config import Algorithm as AlgorithmConfig
from runtime.config import Trainer as TrainerConfig
from runtime.registry import Registry

# `trainer.type`: Trainer subclasses, constructed as
# `cls(model, pad_id, trainer_config, algorithm_config, temperature=, ref_model=)`.
TRAINERS: Registry[type] = Registry(
    "trainer", "trainer.type", reserved={"custom": "the class trainer.custom_trainer_module_path names"})
register_trainer = TRAINERS.register


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int
    samples: int
    seconds: float
    metrics: dict[str, float]


class Trainer:
    """Shared by every trainer: the model, AdamW, gradient clipping, micro-batching."""

    name = "base"

    def __init__(self, model: torch.nn.Module, pad_id: int, trainer_config: TrainerConfig,
                 algorithm_config: AlgorithmConfig | None = None, temperature: float = 1.0,
                 ref_model: torch.nn.Module | None = None):
        self.model = model
        self.pad_id = pad_id
        self.config = trainer_config
        self.algorithm = algorithm_config or AlgorithmConfig()
        self.temperature = temperature
        self.ref_model = ref_model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=trainer_config.lr,
                                           weight_decay=trainer_config.weight_decay)

    def _prepare_trajectories(self, trajectories: list[TrainItem], metrics: dict[str, float]) -> list[TrainItem]:
        """Override to change the step's samples (advantages, weights, which ones train);
        what is put in `metrics` is recorded with the step."""
        return trajectories

    def _prepare_batch(self, items: list[TrainItem]) -> list[TrainItem]:
        """Override to reshape, filter or re-weight the batch before the loss."""
        return items

    def micro_batch_loss(self, batch: dict[str, torch.Tensor], global_tokens: float,
                         global_sequences: float) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def logprobs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits = logits / self.temperature
        return token_logprobs(logits, batch["input_ids"]), logits

    def step(self, items: list[TrainItem]) -> StepResult:
        started = time.perf_counter()
        prepared: dict[str, float] = {}
        items = self._prepare_batch(self._prepare_trajectories(list(items), prepared))
        if not items:
            raise ValueError("a training step needs at least one sample")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        global_tokens = float(max(1, sum(int(item.mask.sum()) for item in items)))
        global_sequences = float(len(items))
        totals: dict[str, float] = {}
        loss_total = 0.0
        groups = micro_batches_by_tokens([len(item.tokens) for item in items], self.config.micro_batch_tokens)
        for indices in groups:
            batch = collate([items[i] for i in indices], self.pad_id)
            loss, sums = self.micro_batch_loss(batch, global_tokens, global_sequences)
            loss.backward()
            loss_total += float(loss.detach())
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + value
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip or math.inf)
        self.optimizer.step()
        # Sums of per-token quantities become means over the batch's trained tokens.
        metrics = {key.removesuffix("_sum"): value / global_tokens for key, value in totals.items()}
        metrics.update({key: float(value) for key, value in prepared.items()})
        return StepResult(loss=loss_total, grad_norm=float(grad_norm), tokens=int(global_tokens),
                          samples=len(items), seconds=time.perf_counter() - started, metrics=metrics)


@register_trainer("grpo")
class GRPOTrainer(Trainer):
    name = "grpo"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.policy_loss = POLICY_LOSSES.get(self.algorithm.off_policy_correction)
        self.kl_controller = make_kl_controller(self.algorithm.kl_ctrl)
        uses_kl = self.algorithm.use_kl_loss or self.algorithm.use_kl_in_reward
        if uses_kl and self.ref_model is None:
            raise ValueError("algorithm.use_kl_loss / use_kl_in_reward need a reference model")

    def micro_batch_loss(self, batch, global_tokens, global_sequences):
        algo = self.algorithm
        mask = batch["mask"]
        logprobs, logits = self.logprobs(self.model, batch)
        behaviour = batch["behaviour_logprobs"]
        advantages = batch["advantages"]
        sums: dict[str, float] = {}
        token_kl = None
        if self.ref_model is not None and (algo.use_kl_loss or algo.use_kl_in_reward):
            with torch.no_grad():
                ref_logprobs, _ = self.logprobs(self.ref_model, batch)
            token_kl = kl_penalty(logprobs, ref_logprobs, algo.kl_estimator)
            sums["kl_sum"] = float((token_kl.detach() * mask).sum())
            if algo.use_kl_in_reward:
                advantages = advantages - self.kl_controller.kl_coef * kl_reward_to_go(token_kl.detach(), mask)

        policy = self.policy_loss(logprobs, behaviour, advantages, mask, algo)  # algos/losses.py, by off_policy_correction
        token_loss, clipped = policy.token_loss, policy.clipped
        if policy.importance_weights is not None:
            sums["importance_weight_sum"] = float((policy.importance_weights * mask).sum())
        if token_kl is not None and algo.use_kl_loss:
            token_loss = token_loss + self.kl_controller.kl_coef * token_kl
        loss = aggregate_loss(token_loss, mask, algo.loss_agg_mode, global_tokens, global_sequences)
        with torch.no_grad():
            entropy = entropy_from_logits(logits)
            ratio = torch.exp(logprobs.detach() - behaviour)
            sums["entropy_sum"] = float((entropy * mask).sum())
            sums["clip_fraction_sum"] = float((clipped * mask).sum())
            sums["ratio_sum"] = float((ratio * mask).sum())
            sums["behaviour_kl_sum"] = float(((behaviour - logprobs.detach()) * mask).sum())
        return loss, sums

    def step(self, items):
        result = super().step(items)
        if "kl" in result.metrics:
            self.kl_controller.update(result.metrics["kl"], 1)
        result.metrics["kl_coef"] = self.kl_controller.kl_coef
        return result


@register_trainer("cross_entropy")
class CrossEntropyTrainer(Trainer):
    """Supervised warm-up: -log p of the masked tokens, token-mean over the batch."""

    name = "cross_entropy"

    def micro_batch_loss(self, batch, global_tokens, global_sequences):
        logprobs, logits = self.logprobs(self.model, batch)
        loss = aggregate_loss(-logprobs, batch["mask"], "token-mean", global_tokens, global_sequences)
        with torch.no_grad():
            entropy = entropy_from_logits(logits)
        return loss, {"entropy_sum": float((entropy * batch["mask"]).sum())}


def compute_grpo_advantage_for_trajectories(trajectories: list[TrainItem], estimator: str = "grpo") -> list[TrainItem]:
    """Advantages from the rewards of each group (samples sharing a group id), with a
    registered estimator (GRPO by default): what a custom trainer calls after changing
    rewards. Sets each item's `advantage` (and clears per-token advantages)."""
    estimate = get_advantage_estimator(estimator)
    groups: dict[str, list[TrainItem]] = {}
    for item in trajectories:
        groups.setdefault(item.group_id, []).append(item)
    for members in groups.values():
        advantages = estimate(np.asarray([item.reward for item in members], dtype=np.float64))
        for item, advantage in zip(members, advantages):
            item.advantage, item.token_advantages = float(advantage), None
    return trajectories

