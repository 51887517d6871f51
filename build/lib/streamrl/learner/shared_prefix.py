"""Shared-prefix forward: a prompt's rollouts share it, so it runs once for them all.

A GRPO group is one prompt sampled n times. The plain forward runs the prompt n times,
once in each sample's row. Here each distinct prompt of a micro-batch runs once, with
its keys and values cached, and every sample then runs only its own tokens (the
answer, and in a multi-turn sample the turns after it) on top of its prompt's cache.
Attention, positions and so the logprobs are the plain forward's; the prompt's
gradient is the sum of what each sample sends back through its copy of the cache,
which is what the plain forward sums over the n copies. Tested against the plain
forward (tests/test_shared_prefix.py); the first micro-batch of a run is checked the
same way before it trains (learner/trainers.py).

Where the prompt is half of each sample (the built-in recipes), a step's forward and
backward handle about half the tokens.

The prefix of a sample is its tokens before the first one that trains (its loss mask),
kept to at least one token and at most all but the last. Samples whose prefixes are the
same token for token share it; a micro-batch where none do runs the plain forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamrl.learner.batching import ForwardInputs


@dataclass(frozen=True)
class PrefixPlan:
    """How a micro-batch of B right-padded rows splits into G distinct prefixes and
    each row's own tokens (its suffix)."""

    prefix_ids: torch.Tensor  # long [G, P], left-padded
    prefix_mask: torch.Tensor  # long [G, P]
    row_prefix: torch.Tensor  # long [B]: the prefix each row shares
    prefix_lengths: torch.Tensor  # long [B]: its length
    suffix_ids: torch.Tensor  # long [B, S], right-padded
    suffix_mask: torch.Tensor  # long [B, S]


def plan_prefixes(batch: ForwardInputs, trains: torch.Tensor, pad_id: int) -> PrefixPlan | None:
    """The plan for `batch` (`trains`: [B, T], > 0 where a token trains), or None when no
    two rows share a prefix (nothing to gain)."""
    row_lengths = batch.attention_mask.sum(-1)
    lengths = row_lengths.tolist()
    if min(lengths) < 2:
        return None
    first_trained = torch.where(trains.any(-1), (trains > 0).float().argmax(-1), row_lengths)
    prefix_lengths = [max(1, min(int(first), n - 1)) for first, n in zip(first_trained.tolist(), lengths)]
    rows = batch.input_ids.tolist()
    distinct: dict[tuple[int, ...], int] = {}
    row_prefix = [distinct.setdefault(tuple(row[:p]), len(distinct)) for row, p in zip(rows, prefix_lengths)]
    if len(distinct) == len(rows):
        return None
    width = max(prefix_lengths)
    prefix_ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    prefix_mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for index, prefix in enumerate(distinct):
        prefix_ids[index, width - len(prefix) :] = torch.tensor(prefix)
        prefix_mask[index, width - len(prefix) :] = 1
    suffix_width = max(n - p for n, p in zip(lengths, prefix_lengths))
    suffix_ids = torch.full((len(rows), suffix_width), pad_id, dtype=torch.long)
    suffix_mask = torch.zeros((len(rows), suffix_width), dtype=torch.long)
    for index, (row, n, p) in enumerate(zip(rows, lengths, prefix_lengths)):
        suffix_ids[index, : n - p] = torch.tensor(row[p:n])
        suffix_mask[index, : n - p] = 1
    return PrefixPlan(prefix_ids, prefix_mask, torch.tensor(row_prefix), torch.tensor(prefix_lengths), suffix_ids, suffix_mask)


def shared_prefix_logits(model: torch.nn.Module, plan: PrefixPlan, device) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, S + 1, V] logits, [B, S + 1] tokens): position 0 is each row's last prefix
    token and the logits after it, positions 1.. its suffix and the logits after each."""
    prefix_ids, prefix_mask = plan.prefix_ids.to(device), plan.prefix_mask.to(device)
    row_prefix, suffix_ids = plan.row_prefix.to(device), plan.suffix_ids.to(device)
    prefix_positions = (prefix_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=prefix_positions, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    for layer in cache.layers:  # each row's copy of its prefix's keys and values (gradients flow back)
        layer.keys, layer.values = layer.keys.index_select(0, row_prefix), layer.values.index_select(0, row_prefix)
    width, suffix_width = prefix_ids.shape[1], suffix_ids.shape[1]
    suffix_positions = plan.prefix_lengths.to(device).unsqueeze(-1) + torch.arange(suffix_width, device=device)
    attention = torch.cat([prefix_mask.index_select(0, row_prefix), plan.suffix_mask.to(device)], dim=-1)
    suffix_logits = model(
        input_ids=suffix_ids,
        attention_mask=attention,
        position_ids=suffix_positions,
        past_key_values=cache,
        use_cache=True,
        cache_position=torch.arange(width, width + suffix_width, device=device),
    ).logits
    logits = torch.cat([out.logits[:, -1:].index_select(0, row_prefix), suffix_logits], dim=1)
    tokens = torch.cat([prefix_ids[:, -1:].index_select(0, row_prefix), suffix_ids], dim=1)
    return logits, tokens


def to_row_layout(values: torch.Tensor, plan: PrefixPlan, width: int) -> torch.Tensor:
    """[B, S + 1] values in the plan's layout (position 0: the last prefix token) ->
    [B, width] in the padded rows' layout; prefix positions before the last take 0, as
    a row's first token does in the plain forward (none of them trains)."""
    device = values.device
    offset = torch.arange(width, device=device) - (plan.prefix_lengths.to(device).unsqueeze(-1) - 1)
    inside = (offset >= 0) & (offset < values.shape[1])
    gathered = values.gather(1, offset.clamp(0, values.shape[1] - 1))
    return gathered.masked_fill(~inside, 0.0)


def uses_shared_prefix(config, model: torch.nn.Module, packed: bool, world_size: int) -> bool:
    """`trainer.shared_prefix` where it can run: one learner process (two forwards before
    one backward are not measured under FSDP2), padded rows (a packed row already runs
    each token once) and no gradient checkpointing (which turns the KV cache off in
    training). `auto` leaves it off elsewhere; `on` elsewhere is refused (the recipe's
    checks refuse it first where the recipe alone tells)."""
    if config.shared_prefix == "off" or getattr(model, "config", None) is None:
        return False
    blocker = (
        "several learner processes"
        if world_size > 1
        else "packed rows"
        if packed
        else "gradient checkpointing"
        if config.gradient_checkpointing
        else None
    )
    if blocker and config.shared_prefix == "on":
        raise ValueError(f"trainer.shared_prefix: on does not run with {blocker}; set it to auto or off")
    return blocker is None
