"""From samples to padded tensors, and micro-batches by token budget.

Sequences are right-padded into a `MicroBatch` (one named tensor a field); its
`loss_mask` marks the tokens that train. A micro-batch holds as many sequences as fit
in `micro_batch_tokens` padded tokens (at least one), so memory per forward pass is
bounded whatever the sequence lengths are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class TrainItem:
    """One sequence to train on, as the learner sees it."""

    tokens: np.ndarray  # int32 [T]
    mask: np.ndarray  # uint8 [T]
    behaviour_logprobs: np.ndarray  # float32 [T]
    advantage: float = 0.0
    token_advantages: np.ndarray | None = None  # float32 [T] when the estimator is per token
    weight_version: int = 0
    trajectory_id: str = ""
    reward: float = 0.0
    group_id: str = ""
    extra: dict = field(default_factory=dict)
    token_versions: np.ndarray | None = None  # int32 [T]: a rollout sampled under several versions
    behaviour_lag: np.ndarray | None = None  # int32 [T]: versions between the sampler and the learner
    # float32 [T]: the ratio's denominator when it is not the behaviour logprobs
    # (algorithm.do_old_log_prob_compute: the learner's own logprobs before the step)
    old_logprobs: np.ndarray | None = None

    # The guide's trainers read and write trajectories as dicts (`traj["reward"]`,
    # `traj.get("run_id")`): fields by name, anything else kept in `extra`.
    @property
    def run_id(self) -> str:
        """The guide's name for the group (the rollouts of one prompt)."""
        return self.group_id

    def __getitem__(self, key: str):
        if key == "run_id" or key in self.__dataclass_fields__:
            return getattr(self, key)
        return self.extra[key]

    def __setitem__(self, key: str, value) -> None:
        if key in self.__dataclass_fields__:
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def __contains__(self, key: str) -> bool:
        return key == "run_id" or key in self.__dataclass_fields__ or key in self.extra

    def get(self, key: str, default=None):
        return self[key] if key in self else default


def micro_batches_by_tokens(lengths: list[int], micro_batch_tokens: int) -> list[list[int]]:
    """Indices grouped in order so that len(group) * max(length in group) <= budget
    (a sequence longer than the budget gets a micro-batch of its own)."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index, length in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, length) > micro_batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class PackedRow:
    """The samples of a micro-batch end to end in one row, as the model runs on it
    (learner/packing.py). N: the micro-batch's real tokens; B, T: its padded layout."""

    input_ids: torch.Tensor  # long [1, N]
    position_ids: torch.Tensor  # long [1, N], restarting at 0 for each sample
    unpack_index: torch.Tensor  # long [B, T]: each padded position's place in the row (0 on padding)

    def to(self, device) -> PackedRow:
        return PackedRow(*(value.to(device) for value in (self.input_ids, self.position_ids, self.unpack_index)))


@dataclass(frozen=True, kw_only=True)
class ForwardInputs:
    """What a forward pass reads: B right-padded rows of T tokens, and, when the
    micro-batch is packed, the packed row the model runs on instead."""

    input_ids: torch.Tensor  # long [B, T], pad_id past each row's end
    attention_mask: torch.Tensor  # long [B, T], 1 on a row's own tokens
    packed: PackedRow | None = None

    def to(self, device):
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        moved = {name: value.to(device) if value is not None else None for name, value in moved.items()}
        return dataclasses.replace(self, **moved)


@dataclass(frozen=True, kw_only=True)
class MicroBatch(ForwardInputs):
    """One micro-batch as every loss reads it; every tensor is [B, T], 0 on padding."""

    loss_mask: torch.Tensor  # float32: 1 where a token trains (sampled by the policy)
    behaviour_logprobs: torch.Tensor  # float32: the sampler's logprob of each token
    # float32: the PPO ratio's denominator: the behaviour logprobs, or the learner's own
    # logprobs before the step (algorithm.do_old_log_prob_compute)
    ratio_denominator: torch.Tensor
    advantages: torch.Tensor  # float32: the sample's advantage on each of its tokens (or per-token ones)
    behaviour_lag: torch.Tensor  # int32: weight versions between the token's sampler and the learner


def collate(items: list[TrainItem], pad_id: int) -> MicroBatch:
    """The items as one right-padded `MicroBatch` (B = len(items), T = the longest)."""
    width = max(len(item.tokens) for item in items)
    shape = (len(items), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    ratio_denominator = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    lag = torch.zeros(shape, dtype=torch.int32)
    for row, item in enumerate(items):
        n = len(item.tokens)
        input_ids[row, :n] = torch.from_numpy(item.tokens.astype(np.int64))
        attention[row, :n] = 1
        loss_mask[row, :n] = torch.from_numpy(item.mask.astype(np.float32))
        behaviour[row, :n] = torch.from_numpy(item.behaviour_logprobs.astype(np.float32))
        ratio_denominator[row, :n] = torch.from_numpy(
            (item.behaviour_logprobs if item.old_logprobs is None else item.old_logprobs).astype(np.float32)
        )
        if item.token_advantages is not None and len(item.token_advantages):
            advantages[row, :n] = torch.from_numpy(item.token_advantages.astype(np.float32))
        else:
            advantages[row, :n] = item.advantage
        if item.behaviour_lag is not None:
            lag[row, :n] = torch.from_numpy(item.behaviour_lag.astype(np.int32))
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour,
        ratio_denominator=ratio_denominator,
        advantages=advantages,
        behaviour_lag=lag,
    )
