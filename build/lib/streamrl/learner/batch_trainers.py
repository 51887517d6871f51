"""The guide's self-hosted trainer API: `Batch` and `SelfHostedTrainer`.

    class MyTrainer(SelfHostedTrainer):
        def __init__(self, config):                 # the whole recipe (OmegaConf)
            super().__init__(config)
            self._my_param = config.algorithm.get("my_param", 1.0)

        def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:
            batch.values["advantages"] = ...        # [B, T], or batch.metadata["advantages"]: one per row
            return batch, {"my/metric": 1.0}

A step's samples become one right-padded `Batch` (values: input_ids, attention_mask,
position_ids, loss_mask, behaviour_log_probs; metadata: rewards, group_ids and run_ids (the
guide's name for the same list: the group of
each row, as the guide's trainers group by), trajectory_ids, advantages (the stream
processor's)); what `_prepare_batch` returns is trained: advantages from
`values["advantages"]` (per token) or `metadata["advantages"]` (per row),
`values["old_log_probs"]` as the ratio's denominator when present, rows removed or
reordered by `metadata["trajectory_ids"]`. The returned metrics are recorded with the
step. `SelfHostedGrpoTrainer` is the guide's GRPO pipeline on this API.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

import numpy as np
import torch

from streamrl.algos.advantages import advantages_by_group
from streamrl.learner.batching import ForwardInputs, TrainItem, collate
from streamrl.learner.step_metrics import _stats
from streamrl.learner.trainers import GRPOTrainer, register_trainer

ROW_NUMBERS = ("rewards", "advantages")  # metadata with one number per row


def row_numbers(key: str, value) -> torch.Tensor:
    """One number per row (a list of floats or of 0-d tensors, or a tensor) as float32 [B]."""
    if isinstance(value, torch.Tensor):
        return value.detach().float().reshape(-1)
    try:
        return torch.tensor([float(v) for v in value], dtype=torch.float32)
    except (TypeError, ValueError):
        raise TypeError(f"Batch.metadata[{key!r}]: expected one number per row, got {value!r:.200}") from None


class RowData(dict):
    """`Batch.metadata`: one entry per row. The numeric ones (`rewards`, `advantages`) are
    held as float tensors [B] whatever is assigned, so the guide's listings can do tensor
    maths on them (`torch.mean(batch.metadata["rewards"])`) and loop over them alike."""

    def __init__(self, values=()):
        super().__init__()
        for key, value in dict(values).items():
            self[key] = value

    def __setitem__(self, key, value):
        super().__setitem__(key, row_numbers(key, value) if key in ROW_NUMBERS else value)


class TokenData(dict):
    """`Batch.values`: [B, T] tensors. Where only the rows' advantages are given
    (`metadata["advantages"]`, one per row), `values["advantages"]` reads them ([B]): the
    guide's pattern-1 listing writes the one and reads the other."""

    def __init__(self, values=(), rows: RowData | None = None):
        super().__init__(values)
        self._rows = rows if rows is not None else RowData()

    def _from_rows(self, key) -> bool:
        return key == "advantages" and not super().__contains__(key) and key in self._rows

    def __contains__(self, key) -> bool:
        return super().__contains__(key) or self._from_rows(key)

    def __getitem__(self, key):
        return self._rows[key] if self._from_rows(key) else super().__getitem__(key)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def own(self, key):
        """The [B, T] value itself, never the rows' stand-in."""
        return super().get(key)


@dataclass
class Batch:
    values: dict[str, torch.Tensor] = field(default_factory=dict)  # [B, T] tensors (TokenData)
    metadata: dict[str, list] = field(default_factory=dict)  # one entry per row (RowData)

    def __setattr__(self, name, value):
        if name == "metadata":
            value = value if isinstance(value, RowData) else RowData(value)
            if isinstance(self.__dict__.get("values"), TokenData):
                self.__dict__["values"]._rows = value
        elif name == "values":
            value = TokenData(value, self.__dict__.get("metadata"))
        super().__setattr__(name, value)

    def __post_init__(self):
        self.values._rows = self.metadata

    def __len__(self) -> int:
        return int(self.values["input_ids"].shape[0]) if "input_ids" in self.values else 0

    @staticmethod
    def from_items(items: list[TrainItem], pad_token_id: int) -> Batch:
        padded = collate(items, pad_token_id)
        attention = padded.attention_mask
        group_ids = [item.group_id for item in items]
        return Batch(
            values={
                "input_ids": padded.input_ids,
                "attention_mask": attention,
                "position_ids": compute_position_id_with_mask(attention),
                "loss_mask": padded.loss_mask.long(),
                "behaviour_log_probs": padded.behaviour_logprobs,
            },
            # run_ids: the guide's name for the group ids, kept for its listings
            metadata={
                "rewards": [item.reward for item in items],
                "group_ids": group_ids,
                "run_ids": list(group_ids),
                "trajectory_ids": [item.trajectory_id for item in items],
                "advantages": [item.advantage for item in items],
            },
        )

    def to_items(self, originals: list[TrainItem]) -> list[TrainItem]:
        """The rows as the learner trains them (see the module's docstring)."""
        by_id = {item.trajectory_id: item for item in originals}
        rows = []
        values = typing.cast(TokenData, self.values)  # __setattr__ stores every mapping as TokenData
        token_advantages = values.own("advantages")
        row_advantages = self.metadata.get("advantages")
        old = values.own("old_log_probs")
        count = len(self.metadata["trajectory_ids"])
        for key in ("rewards", "advantages"):
            if key in self.metadata and len(self.metadata[key]) != count:
                raise ValueError(f"_prepare_batch left metadata[{key!r}] with {len(self.metadata[key])} entries for {count} rows")
        for row, trajectory_id in enumerate(self.metadata["trajectory_ids"]):
            item = by_id[trajectory_id]
            keep = self.values["attention_mask"][row].bool()
            item.tokens = self.values["input_ids"][row][keep].numpy().astype(np.int32)
            item.mask = self.values["loss_mask"][row][keep].numpy().astype(np.uint8)
            if "rewards" in self.metadata:
                item.reward = float(self.metadata["rewards"][row])
            if token_advantages is not None:
                item.token_advantages = token_advantages[row][keep].detach().float().numpy()
            elif row_advantages is not None:
                item.advantage, item.token_advantages = float(row_advantages[row]), None
            if old is not None:
                item.old_logprobs = old[row][keep].detach().float().numpy()
            rows.append(item)
        return rows

    @staticmethod
    def remove_redundant_left_padding(
        batch: Batch, pad_token_id: int, anchor_field: str = "input_ids", fields: list[str] | None = None
    ) -> Batch:
        """Drop leading columns that are padding in every row."""
        return _trim(batch, pad_token_id, anchor_field, fields, left=True)

    @staticmethod
    def remove_redundant_right_padding(
        batch: Batch, pad_token_id: int, anchor_field: str = "input_ids", fields: list[str] | None = None
    ) -> Batch:
        """Drop trailing columns that are padding in every row."""
        return _trim(batch, pad_token_id, anchor_field, fields, left=False)


def _trim(batch: Batch, pad_token_id: int, anchor_field: str, fields: list[str] | None, left: bool) -> Batch:
    # padding is where the attention mask is 0 (the anchor's pad id when there is none:
    # a real token may share the pad id)
    mask = batch.values.get("attention_mask")
    used = (mask != 0) if mask is not None else (batch.values[anchor_field] != pad_token_id)
    columns = used.any(dim=0).nonzero().flatten()
    if len(columns) == 0:
        return batch
    start, end = (int(columns[0]), used.shape[1]) if left else (0, int(columns[-1]) + 1)
    width = used.shape[1]
    for name in fields or list(batch.values):
        value = batch.values[name]
        if value.dim() >= 2 and value.shape[1] == width:
            batch.values[name] = value[:, start:end]
    return batch


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only attended tokens (0 at each row's first token)."""
    return torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)


def padding_data(batch: Batch, pad_token_id: int, width: int | None = None) -> Batch:
    """Right-pad every [B, T] value to `width` columns (default: a multiple of 8)."""
    current = batch.values["input_ids"].shape[1]
    width = width or -(-current // 8) * 8
    for name, value in batch.values.items():
        if value.dim() >= 2 and value.shape[1] == current and width > current:
            fill = pad_token_id if name == "input_ids" else 0
            extra = torch.full((value.shape[0], width - current), fill, dtype=value.dtype)
            batch.values[name] = torch.cat([value, extra], dim=1)
    return batch


class SelfHostedTrainer(GRPOTrainer):
    """The guide's base class: implement `_prepare_batch(batch) -> (batch, metrics)`; the
    loss is the recipe's policy loss (PPO clip with its off-policy correction)."""

    def __init__(self, config):
        # The guide's signature is `cls(config)`; the model and the rest are set on the
        # instance by the factory before this runs (learner/trainer_factory.py).
        parts = self.__dict__.get("_runtime_parts")
        if parts is None:  # built outside the learner, as the guide's unit test does: a detached trainer
            parts = detached_parts(config)
        super().__init__(**parts)
        self._config = config
        self._pad_token_id = parts["pad_id"]
        self._use_kl_in_reward = self.algorithm.use_kl_in_reward
        self._rollout_metrics: dict[str, float] = {}

    def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:  # type: ignore[override]  # the guide's signature
        raise NotImplementedError(f"{type(self).__name__}._prepare_batch(batch) -> (batch, metrics)")

    def prepare(self, items):
        items, prepared = list(items), {}
        items = self._prepare_trajectories(items, prepared)
        self._rollout_metrics = {}
        batch, metrics = self._prepare_batch(Batch.from_items(items, self._pad_token_id))
        items = batch.to_items(items)
        if not items:
            raise ValueError("_prepare_batch left no rows to train on")
        if self.algorithm.do_old_log_prob_compute:
            self.recompute_old_logprobs(items)
        prepared.update(self._rollout_metrics)
        prepared.update({key: float(value) for key, value in (metrics or {}).items()})
        return items, prepared

    # --- the guide's helpers ------------------------------------------------------------------
    def _log_rollout_metrics(self, batch: Batch) -> None:
        rewards = batch.metadata.get("rewards", [])
        lengths = batch.values["loss_mask"].sum(dim=1).tolist()
        self._rollout_metrics.update(_stats("rollout/reward", rewards))
        self._rollout_metrics.update(_stats("rollout/response_length", lengths))

    @torch.no_grad()
    def _compute_old_log_probs(self, batch: Batch) -> torch.Tensor:
        """The current policy's logprob of each token ([B, T], 0 at padding)."""
        if self.placement.world_size > 1:  # a sharded forward needs every rank; _prepare_batch runs on rank 0
            raise RuntimeError(
                "_compute_old_log_probs needs the whole policy in one process: run the learner with "
                "trainer.nproc_per_node: 1 and nnodes: 1 for a trainer that calls it"
            )
        self.model.eval()
        logprobs, _ = self.logprobs(
            self.model, ForwardInputs(input_ids=batch.values["input_ids"], attention_mask=batch.values["attention_mask"])
        )
        return logprobs.float().cpu() * batch.values["attention_mask"]

    def _reward_fn(self, batch: Batch) -> torch.Tensor:
        """Each row's scalar reward on its last trained token ([B, T])."""
        loss_mask = batch.values["loss_mask"]
        scores = torch.zeros(loss_mask.shape, dtype=torch.float32)
        for row, reward in enumerate(batch.metadata["rewards"]):
            trained = torch.where(loss_mask[row] == 1)[0]
            if len(trained):
                scores[row, trained[-1]] = float(reward)
        return scores

    def _apply_kl_penalty(self, batch: Batch, beta: float) -> Batch:
        """token_level_scores -= beta * (log_probs - ref_log_probs); both are computed
        when the batch lacks them (the reference is the policy at the start of RL)."""
        if self.ref_model is None:
            raise ValueError("_apply_kl_penalty needs a reference model: set algorithm.use_kl_in_reward: true")
        if "log_probs" not in batch.values:
            batch.values["log_probs"] = self._compute_old_log_probs(batch)
        if "ref_log_probs" not in batch.values:
            with torch.no_grad():
                ref, _ = self.logprobs(
                    self.ref_model,
                    ForwardInputs(input_ids=batch.values["input_ids"], attention_mask=batch.values["attention_mask"]),
                )
            batch.values["ref_log_probs"] = ref.float().cpu() * batch.values["attention_mask"]
        kl = (batch.values["log_probs"] - batch.values["ref_log_probs"]) * batch.values["loss_mask"]
        batch.values["token_level_scores"] = batch.values["token_level_scores"] - beta * kl
        return batch

    def _compute_advantage(self, batch: Batch) -> Batch:
        """Outcome advantages by the recipe's estimator (`algorithm.type`, GRPO by default)
        over each group of rows sharing a run_id, from the summed token-level scores,
        spread over each row's trained tokens."""
        scores = batch.values["token_level_scores"].sum(dim=1).tolist()
        token_counts = batch.values["loss_mask"].sum(dim=1).tolist()
        # run_ids, not group_ids: the guide's trainers edit the rows under that name
        advantages = advantages_by_group(
            batch.metadata["run_ids"], scores, token_counts, self.algorithm.type, self.algorithm.grpo_std_epsilon
        ).tolist()
        batch.metadata["advantages"] = advantages
        batch.values["advantages"] = torch.tensor(advantages, dtype=torch.float32)[:, None] * batch.values["loss_mask"]
        return batch

    def _compute_data_metrics(self, batch: Batch) -> dict[str, float]:
        trained = batch.values["loss_mask"].bool()
        metrics = _stats("critic/score", batch.values["token_level_scores"].sum(dim=1).tolist())
        metrics.update(_stats("critic/advantages", batch.values["advantages"][trained].tolist()))
        return metrics


class DetachedModel(torch.nn.Module):
    """The model of a trainer built outside the learner: it has no weights to train."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))
        self.config = None  # no attention implementation: no packing

    def forward(self, *args, **kwargs):
        raise RuntimeError(
            "this trainer was built as cls(config), outside the learner: _prepare_batch and its "
            "helpers work, a forward pass or a step needs the learner's model (run the recipe, or "
            "build it with learner.trainer_factory.build_trainer)"
        )


def detached_parts(config) -> dict:
    """What a trainer built as `cls(config)` outside the learner holds: the config's
    algorithm and trainer sections, no model. The pad id is 0: padding is found by the
    attention mask, and the pad id is only the fallback for a batch without one."""
    from streamrl.runtime.config import Algorithm, _build
    from streamrl.runtime.config import Trainer as TrainerSection

    def section(name: str) -> dict:
        value = config.get(name) if hasattr(config, "get") else None
        return dict(value or {})

    return dict(
        model=DetachedModel(),
        pad_id=0,
        trainer_config=_build(TrainerSection, section("trainer"), "trainer."),
        algorithm_config=_build(Algorithm, section("algorithm"), "algorithm."),
    )


@register_trainer("self_hosted_grpo")
class SelfHostedGrpoTrainer(SelfHostedTrainer):
    """GRPO as the guide's pipeline writes it: rollout metrics, padding removal, old log
    probs (with do_old_log_prob_compute), token-level scores, the KL penalty in the
    reward (use_kl_in_reward), group-relative advantages, data metrics."""

    kl_in_reward_in_loss = False  # the KL penalty is in the token-level scores already

    def _prepare_batch(self, batch: Batch) -> tuple[Batch, dict]:  # type: ignore[override]  # the guide's signature
        metrics: dict[str, float] = {}
        self._log_rollout_metrics(batch)
        batch = Batch.remove_redundant_left_padding(batch, pad_token_id=self._pad_token_id)
        batch = Batch.remove_redundant_right_padding(batch, pad_token_id=self._pad_token_id)
        if self.algorithm.do_old_log_prob_compute:
            batch.values["old_log_probs"] = self._compute_old_log_probs(batch)
        batch.values["token_level_scores"] = self._reward_fn(batch)
        if self.algorithm.use_kl_in_reward:
            batch = self._apply_kl_penalty(batch, self.kl_controller.kl_coef)
            metrics["kl_in_reward/coef"] = self.kl_controller.kl_coef
        batch = self._compute_advantage(batch)
        metrics.update(self._compute_data_metrics(batch))
        return batch, metrics
