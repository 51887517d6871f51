"""Sequence packing: several samples in one row, no padding.

A packed micro-batch is one row of `micro_batch_tokens` at most: the samples' tokens
end to end, with position ids restarting at 0 for each sample. transformers turns
restarting position ids into a block-diagonal causal mask (`find_packed_sequence_indices`
in its masking utilities), so no token attends across a sample boundary.

The model runs on the packed row; its per-token outputs (log-probabilities, entropy)
are then gathered back into the padded [samples, longest] layout `collate` gives, so
every loss, correction and aggregation (per-sequence ones included) sees exactly what
it sees unpacked. Tested: packed and unpacked micro-batches give the same loss and
gradient.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from streamrl.learner.batching import MicroBatch, PackedRow, TrainItem, collate


def pack_by_tokens(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped in order so that the sum of lengths in a group is <= budget (a
    sample longer than the budget gets a row of its own)."""
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index, length in enumerate(lengths):
        if current and used + length > budget:
            groups.append(current)
            current, used = [], 0
        current.append(index)
        used += length
    if current:
        groups.append(current)
    return groups


def collate_packed(items: list[TrainItem], pad_id: int) -> MicroBatch:
    """`collate`'s micro-batch, with the packed row the model runs on (`packed`)."""
    batch = collate(items, pad_id)
    lengths = [len(item.tokens) for item in items]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    tokens = np.concatenate([item.tokens.astype(np.int64) for item in items])
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    index = np.zeros((len(items), batch.input_ids.shape[1]), dtype=np.int64)
    for row, (start, n) in enumerate(zip(starts, lengths)):
        index[row, :n] = np.arange(start, start + n)
    packed = PackedRow(
        input_ids=torch.from_numpy(tokens).unsqueeze(0),
        position_ids=torch.from_numpy(positions).unsqueeze(0),
        unpack_index=torch.from_numpy(index),
    )
    return dataclasses.replace(batch, packed=packed)


def unpack(per_token: torch.Tensor, unpack_index: torch.Tensor) -> torch.Tensor:
    """[1, N] or [1, N, ...] values of the packed row -> [B, T] (or [B, T, ...]) in the
    padded layout; padding positions take position 0's value and are masked downstream."""
    flat = per_token[0]
    return flat[unpack_index]


def padding_fraction(lengths: list[int], groups: list[list[int]], packed: bool) -> float:
    """Share of the tokens the model processes that are padding: 0 when packed (each row
    is exactly its samples), else 1 - real / (rows x longest) summed over micro-batches."""
    real = sum(lengths)
    if packed or real == 0:
        return 0.0
    processed = sum(len(group) * max(lengths[i] for i in group) for group in groups)
    return 1.0 - real / processed


VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def uses_packing(setting: str, model: torch.nn.Module) -> bool:
    """`trainer.packing`: auto packs where the attention kernel takes packed rows as
    separate sequences (varlen flash attention); sdpa and eager build a dense mask over
    the whole row, quadratic in its length (6x slower for the built-in recipe's 256
    twelve-token samples on the CPU)."""
    if setting == "auto":
        return getattr(model.config, "_attn_implementation", None) in VARLEN_ATTENTION
    return setting == "packed"
