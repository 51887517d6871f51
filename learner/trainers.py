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
counts (`algos/losses.py`, `aggregate_loss`), so micro-batching never changes the gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from streamrl.algos.advantages import GRPO_EPSILON, advantages_by_group
from streamrl.algos.kl import kl_penalty, kl_reward_to_go, make_kl_controller
from streamrl.algos.losses import (
    POLICY_LOSSES,
    aggregate_loss,
    clamped_ratio,
    masked_sum,
)
from streamrl.learner.batching import ForwardInputs, MicroBatch, TrainItem, collate, micro_batches_by_tokens
from streamrl.learner.output_head import chunkable_head, head_logprobs, hidden_states_out
from streamrl.learner.packing import collate_packed, pack_by_tokens, padding_fraction, unpack, uses_packing
from streamrl.learner.parallel import Placement, all_reduce_maxima, all_reduce_sums, shares_by_tokens
from streamrl.learner.shared_prefix import PrefixPlan, plan_prefixes, shared_prefix_logits, to_row_layout, uses_shared_prefix
from streamrl.learner.step_metrics import logprob_gap_by_lag, logprob_gap_sums
from streamrl.runtime.config import Algorithm as AlgorithmConfig
from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.registry import Registry

# `trainer.type`: Trainer subclasses, constructed as
# `cls(model, pad_id, trainer_config, algorithm_config, temperature=, ref_model=)`.
TRAINERS: Registry[type] = Registry(
    "trainer",
    "trainer.type",
    reserved={
        "custom": "the class trainer.custom_trainer_module_path names",
        "self_hosted": "the guide's base class; the subclass trainer.custom_trainer_module_path names",
    },
)
CUSTOM_TRAINER_TYPES = ("custom", "self_hosted")
register_trainer = TRAINERS.register


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int
    samples: int
    seconds: float
    metrics: dict[str, float]
    skipped: str | None = None  # why the optimizer step was not taken (a non-finite gradient)


@dataclass
class StepTotals:
    """Counts of the whole step, across ranks: every loss divides by these."""

    tokens: float
    sequences: float


class Trainer:
    """Shared by every trainer: the model, AdamW, gradient clipping, micro-batching
    (packed or padded), the device and precision, and the step's share of each rank."""

    name = "base"

    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        trainer_config: TrainerConfig,
        algorithm_config: AlgorithmConfig | None = None,
        temperature: float = 1.0,
        ref_model: torch.nn.Module | None = None,
        placement: Placement | None = None,
    ):
        self.model = model
        self.pad_id = pad_id
        self.config = trainer_config
        self.algorithm = algorithm_config or AlgorithmConfig()
        self.temperature = temperature
        self.ref_model = ref_model
        self.placement = placement or Placement(next(model.parameters()).device)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=trainer_config.lr, weight_decay=trainer_config.weight_decay)
        self.packed = uses_packing(trainer_config.packing, model)
        self.shared_prefix = uses_shared_prefix(trainer_config, model, self.packed, self.placement.world_size)
        self.shared_prefix_checked = False
        # the output layer a chunk of positions at a time where it is exact (learner/output_head.py);
        # off only to measure against (bench/learner_memory.py)
        self.chunk_output = True

    def _prepare_trajectories(self, trajectories: list[TrainItem], metrics: dict[str, float]) -> list[TrainItem]:
        """Override to change the step's samples (advantages, weights, which ones train);
        what is put in `metrics` is recorded with the step."""
        return trajectories

    def _prepare_batch(self, items: list[TrainItem]) -> list[TrainItem]:
        """Override to reshape, filter or re-weight the batch before the loss."""
        return items

    def micro_batch_loss(self, batch: MicroBatch, totals: StepTotals) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's loss (already divided by the step's totals) and sums of
        per-token metrics (`*_sum`, tensors), which become means over the step."""
        raise NotImplementedError

    # --- the model's view of a micro-batch ---------------------------------------------------
    def micro_batches(self, items: list[TrainItem]) -> list[list[int]]:
        lengths = [len(item.tokens) for item in items]
        if self.packed:
            return pack_by_tokens(lengths, self.config.micro_batch_tokens)
        return micro_batches_by_tokens(lengths, self.config.micro_batch_tokens)

    def collate(self, items: list[TrainItem]) -> MicroBatch:
        batch = collate_packed(items, self.pad_id) if self.packed else collate(items, self.pad_id)
        return batch.to(self.placement.device)

    def logprobs(self, model: torch.nn.Module, batch: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of the batch's tokens ([B, T], float32, with gradient) and the
        entropy of each position's next-token distribution ([B, T], no gradient), in the
        padded layout whether the model ran on a packed row, a shared prefix or neither."""
        plan = self.prefix_plan(batch)
        if plan is not None:
            return self.shared_prefix_logprobs(model, batch, plan)
        device = next(model.parameters()).device
        packed = batch.packed.to(device) if batch.packed is not None else None
        tokens = packed.input_ids if packed is not None else batch.input_ids.to(device)
        head = chunkable_head(model, self.placement.sharded) if self.chunk_output else None
        with self.placement.autocast(), hidden_states_out(model, head) if head else contextlib.nullcontext():
            # use_cache=False: no KV cache in training, and transformers detects packed
            # samples from restarting position ids only when there is none
            if packed is not None:
                out = model(input_ids=tokens, position_ids=packed.position_ids, use_cache=False).logits
            else:
                out = model(input_ids=tokens, attention_mask=batch.attention_mask.to(device), use_cache=False).logits
        logprobs, entropy = head_logprobs(out, tokens, head, self.temperature, self.placement.autocast)
        out = None  # the bf16 logits are not needed for the backward pass
        if packed is not None:
            index = packed.unpack_index
            first = torch.zeros_like(index, dtype=torch.bool)
            first[:, 0] = True  # a sample's first token has no prediction inside the sample
            logprobs = unpack(logprobs, index).masked_fill(first, 0.0)
            entropy = unpack(entropy, index)
        device = self.placement.device
        return logprobs.to(device), entropy.to(device)

    def shared_prefix_logprobs(self, model, batch: ForwardInputs, plan: PrefixPlan):
        """`logprobs` with each distinct prompt run once (learner/shared_prefix.py)."""
        head = chunkable_head(model, self.placement.sharded) if self.chunk_output else None
        with self.placement.autocast(), hidden_states_out(model, head) if head else contextlib.nullcontext():
            out, tokens = shared_prefix_logits(model, plan, next(model.parameters()).device)
        logprobs, entropy = head_logprobs(out, tokens, head, self.temperature, self.placement.autocast)
        width, device = batch.input_ids.shape[1], self.placement.device
        return to_row_layout(logprobs, plan, width).to(device), to_row_layout(entropy, plan, width).to(device)

    def prefix_plan(self, batch: ForwardInputs) -> PrefixPlan | None:
        """The shared-prefix plan of a micro-batch, where `trainer.shared_prefix` applies;
        the first one is checked against the plain forward before anything trains on it."""
        trains = getattr(batch, "loss_mask", None)
        if not self.shared_prefix or batch.packed is not None or trains is None:
            return None
        plan = plan_prefixes(batch, trains, self.pad_id)
        if plan is not None and not self.shared_prefix_checked:
            self.shared_prefix_checked = True
            self.check_shared_prefix(batch, plan, trains)
        return plan if self.shared_prefix else None

    def check_shared_prefix(self, batch: ForwardInputs, plan: PrefixPlan, trains: torch.Tensor) -> None:
        """The shared-prefix and plain forwards must agree on this model: where they do
        not (an architecture whose cache works otherwise), `on` stops the run and `auto`
        says so and trains with the plain forward."""
        training = self.model.training
        self.model.eval()  # no dropout: both forwards must see the same function
        try:
            with torch.no_grad():
                self.shared_prefix = False
                plain, _ = self.logprobs(self.model, batch)
                shared, _ = self.shared_prefix_logprobs(self.model, batch, plan)
            gap = float(((plain - shared).abs() * (trains.to(plain.device) > 0)).max())
            tolerance = 1e-3 if self.placement.autocast_dtype is None else 5e-2
            problem = None if gap <= tolerance else f"its logprobs differ from the plain forward's by {gap:.2g}"
        except Exception as exc:  # the model's forward does not take a shared cache
            problem = f"the model's forward failed with it ({type(exc).__name__}: {exc})"
        finally:
            self.model.train(training)
        self.shared_prefix = problem is None
        if problem and self.config.shared_prefix == "on":
            raise RuntimeError(f"trainer.shared_prefix: on, but {problem}; set it to off")
        if problem:
            logging.getLogger(__name__).warning("trainer.shared_prefix: auto: %s; training with the plain forward", problem)

    # --- one optimizer step --------------------------------------------------------------------
    def prepare(self, items: list[TrainItem]) -> tuple[list[TrainItem], dict[str, float]]:
        """The guide's hooks over the whole step (on rank 0 when there are several)."""
        prepared: dict[str, float] = {}
        items = self._prepare_batch(self._prepare_trajectories(list(items), prepared))
        if not items:
            raise ValueError("a training step needs at least one sample")
        if self.algorithm.do_old_log_prob_compute:
            self.recompute_old_logprobs(items)
        return items, prepared

    @torch.no_grad()
    def recompute_old_logprobs(self, items: list[TrainItem]) -> None:
        """`algorithm.do_old_log_prob_compute`: the ratio's denominator becomes the
        learner's own logprobs before the step (one forward pass, no gradient), so the
        clip bounds how far this step moves the policy from itself rather than from the
        sampler (whose numerics may differ). Items that already carry them keep theirs."""
        todo = [item for item in items if item.old_logprobs is None]
        if not todo:
            return
        self.model.eval()
        for group in micro_batches_by_tokens([len(item.tokens) for item in todo], self.config.micro_batch_tokens):
            members = [todo[i] for i in group]
            logprobs, _ = self.logprobs(self.model, collate(members, self.pad_id))
            for row, item in enumerate(members):
                item.old_logprobs = logprobs[row, : len(item.tokens)].float().cpu().numpy()

    def step(self, items: list[TrainItem]) -> StepResult:
        """One optimizer step on `items` in this process."""
        items, prepared = self.prepare(items)
        result = self.train(items, totals_of(items))
        result.metrics.update({key: float(value) for key, value in prepared.items()})
        return result

    def train(self, share: list[TrainItem], totals: StepTotals, rounds: int | None = None) -> StepResult:
        """This rank's share of a step: `rounds` micro-batches (the most any rank has; a
        rank with fewer runs zero-weight ones, since sharded forwards are collectives),
        gradients summed against the whole step's totals, one optimizer step."""
        started = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        groups = self.micro_batches(share)
        rounds = rounds or len(groups)
        # Sums stay tensors on the device until the step ends: a float() per micro-batch
        # would wait for the GPU each time instead of letting it run ahead.
        sums: dict[str, Any] = {"loss": 0.0}  # tensors while summing on the device, floats once reduced
        scale = float(self.placement.world_size)  # FSDP averages gradients over ranks; the step wants their sum
        budget = self.config.micro_batch_tokens
        for round_index in range(rounds):
            if round_index < len(groups):
                members = [share[i] for i in groups[round_index]]
            else:
                members = [zero_weight(share[0])]
            batch = self.collate(members)
            try:
                loss, micro_sums = self.micro_batch_loss(batch, totals)
                (loss * scale).backward()
            except torch.OutOfMemoryError:
                raise RuntimeError(
                    f"out of memory in a micro-batch of {sum(len(m.tokens) for m in members)} "
                    f"tokens on {self.placement.device}: lower trainer.micro_batch_tokens "
                    f"(now {budget}), or set trainer.gradient_checkpointing: true"
                ) from None
            sums["loss"] = sums["loss"] + loss.detach()
            for key, value in micro_sums.items():  # "*_max" keys are maxima, the rest sums
                if key.endswith("_max"):
                    sums[key] = torch.maximum(sums[key], value) if key in sums else value
                else:
                    sums[key] = sums.get(key, 0.0) + value
        values = {key: float(value) for key, value in sums.items()}
        maxima = all_reduce_maxima({key: values.pop(key) for key in list(values) if key.endswith("_max")}, self.placement)
        sums = all_reduce_sums(values, self.placement)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip or math.inf)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        skipped = None
        if not math.isfinite(grad_norm) or not math.isfinite(sums["loss"]):
            # A NaN or inf would corrupt the weights for good: the step is skipped and says why.
            skipped = f"non-finite {'loss' if not math.isfinite(sums['loss']) else 'gradient norm'}"
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        loss_total = sums.pop("loss")
        # Sums of per-token quantities become means over the step's trained tokens; the
        # logprob gap's per-lag sums become means over their own tokens.
        lag_sums = {
            key: values.pop(key) for values in (sums, maxima) for key in list(values) if key.startswith(("gap_lag", "tokens_lag"))
        }
        metrics = {key.removesuffix("_sum"): value / totals.tokens for key, value in sums.items()}
        metrics.update(maxima)
        metrics.update(logprob_gap_by_lag(lag_sums))
        lengths = [len(item.tokens) for item in share]
        metrics["padding_fraction"] = padding_fraction(lengths, groups, self.packed)
        metrics["step_skipped"] = float(skipped is not None)
        if skipped:  # the reason, as a metric the ledger can count: step_skipped_non_finite_loss, ...
            metrics["step_skipped_" + skipped.replace("-", "_").replace(" ", "_")] = 1.0
        return StepResult(
            loss=loss_total,
            grad_norm=grad_norm,
            tokens=int(totals.tokens),
            samples=len(share),
            seconds=time.perf_counter() - started,
            metrics=metrics,
            skipped=skipped,
        )


@dataclass
class StepPlan:
    """A step split over ranks: each rank's share, the step's totals, and the number of
    micro-batches every rank runs (the most any share needs)."""

    shares: list[list[TrainItem]]
    totals: StepTotals
    rounds: int


def plan_step(items: list[TrainItem], world_size: int, micro_batches) -> StepPlan:
    totals = totals_of(items)
    if len(items) < world_size:  # every rank needs a micro-batch to take part in the collectives
        items = items + [zero_weight(items[0])] * (world_size - len(items))
    index_shares = shares_by_tokens([len(item.tokens) for item in items], world_size)
    shares = [[items[i] for i in share] for share in index_shares]
    return StepPlan(shares, totals, max(len(micro_batches(share)) for share in shares))


def totals_of(items: list[TrainItem]) -> StepTotals:
    return StepTotals(tokens=float(max(1, sum(int(item.mask.sum()) for item in items))), sequences=float(len(items)))


def zero_weight(item: TrainItem) -> TrainItem:
    """A micro-batch that runs forward and backward and changes nothing (mask all zero)."""
    return dataclasses.replace(item, mask=np.zeros_like(item.mask))


@register_trainer("grpo")
class GRPOTrainer(Trainer):
    name = "grpo"
    # use_kl_in_reward: the KL reward-to-go is subtracted from the advantages here, unless
    # the trainer put it in the rewards itself (the guide's SelfHostedGrpoTrainer)
    kl_in_reward_in_loss = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.policy_loss = POLICY_LOSSES.get(self.algorithm.policy_loss)
        self.kl_controller = make_kl_controller(self.algorithm.kl_ctrl)
        uses_kl = self.algorithm.use_kl_loss or self.algorithm.use_kl_in_reward
        if uses_kl and self.ref_model is None:
            raise ValueError("algorithm.use_kl_loss / use_kl_in_reward need a reference model")

    def micro_batch_loss(self, batch, totals):
        algo = self.algorithm
        mask = batch.loss_mask
        logprobs, entropy = self.logprobs(self.model, batch)
        behaviour = batch.behaviour_logprobs
        advantages = batch.advantages
        sums: dict[str, torch.Tensor] = {}
        token_kl = None
        if self.ref_model is not None and (algo.use_kl_loss or algo.use_kl_in_reward):
            with torch.no_grad():
                ref_logprobs, _ = self.logprobs(self.ref_model, batch)  # on the CPU when offloaded
            token_kl = kl_penalty(logprobs, ref_logprobs, algo.kl_estimator)
            sums["kl_sum"] = masked_sum(token_kl.detach(), mask)
            if algo.use_kl_in_reward and self.kl_in_reward_in_loss:
                advantages = advantages - self.kl_controller.kl_coef * kl_reward_to_go(token_kl.detach(), mask)

        # the ratio's denominator: the behaviour logprobs, or the learner's own ones
        # recomputed before the step (algorithm.do_old_log_prob_compute)
        old = batch.ratio_denominator
        policy = self.policy_loss(logprobs, old, advantages, mask, algo)  # algos/losses.py, by policy_loss
        token_loss, clipped = policy.token_loss, policy.clipped
        if policy.importance_weights is not None:
            sums["importance_weight_sum"] = masked_sum(policy.importance_weights, mask)
        if token_kl is not None and algo.use_kl_loss:
            token_loss = token_loss + self.kl_controller.kl_coef * token_kl
        loss = aggregate_loss(
            token_loss, mask, algo.loss_agg_mode, totals.tokens, totals.sequences, algo.loss_scale_factor or 1.0
        )
        with torch.no_grad():
            ratio = clamped_ratio(logprobs.detach(), old)
            sums["entropy_sum"] = masked_sum(entropy, mask)
            sums["clip_fraction_sum"] = masked_sum(clipped, mask)
            sums["ratio_sum"] = masked_sum(ratio, mask)
            sums["behaviour_kl_sum"] = masked_sum(behaviour - logprobs.detach(), mask)
            sums.update(logprob_gap_sums(logprobs.detach(), behaviour, mask, batch.behaviour_lag))
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

    def micro_batch_loss(self, batch, totals):
        logprobs, entropy = self.logprobs(self.model, batch)
        loss = aggregate_loss(-logprobs, batch.loss_mask, "token-mean", totals.tokens, totals.sequences)
        return loss, {"entropy_sum": masked_sum(entropy, batch.loss_mask)}


def compute_grpo_advantage_for_trajectories(
    trajectories: list[TrainItem],
    logger=None,
    use_run_ids: bool = True,
    estimator: str = "grpo",
    std_epsilon: float = GRPO_EPSILON,
) -> list[TrainItem]:
    """Advantages from the rewards of each group (samples sharing a run_id, the guide's
    name for the group), with a registered estimator (GRPO by default): what a custom
    trainer calls after changing rewards. Sets each item's `advantage` (and clears
    per-token advantages). `logger` (optional) gets one debug line per call."""
    if not use_run_ids:
        raise ValueError(
            "compute_grpo_advantage_for_trajectories: StreamRL groups by run_id (a task's rollouts); "
            "use_run_ids=False has no other grouping to use"
        )
    advantages = advantages_by_group(
        [item.group_id for item in trajectories],
        [item.reward for item in trajectories],
        [float(item.mask.sum()) for item in trajectories],
        estimator,
        std_epsilon,
    )
    for item, advantage in zip(trajectories, advantages):
        item.advantage, item.token_advantages = float(advantage), None
    if logger is not None:
        logger.debug(
            "advantages of %d trajectories in %d groups", len(trajectories), len({item.group_id for item in trajectories})
        )
    return trajectories
