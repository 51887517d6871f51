"""Sampling for the samplers StreamRL runs itself (the embedded engine and the training
service): drawing the next token (temperature, top-k, top-p) with the logprob the
learner will compare against, and their shared KV-cached decoding loop (`decode`).

The logprob of a drawn token is taken under the tempered distribution *before* top-k
and top-p (greedy: the untempered one): that is what the learner recomputes
(`token_logprobs_and_entropy` at the rollout temperature), so a token's behaviour and
learner logprobs differ only by the weights and numerics, not by the filter.

Each completion draws from its own generator, seeded by `request_seed` from the run's
seed and the task's identity: what a completion samples does not depend on which worker
sampled it, what it was batched with, or when it arrived (docs/anatomy.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Generators = torch.Generator | Sequence[torch.Generator] | None  # one for the batch, or one a row


def request_seed(run_seed: int, key: str) -> int:
    """The sampling seed of one completion: a hash of the run's seed and `key`, the
    completion's identity (task id, try, call within the rollout)."""
    digest = hashlib.blake2b(f"{run_seed}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def row_generators(seeds: Sequence[int], device: torch.device | str = "cpu") -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(seed) for seed in seeds]


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the `top_k` most likely tokens of each row (top_k <= 0: all)."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability adds up to at least top_p."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= top_p  # the mass before this token is already enough
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def draw_tokens(
    logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = -1, generator: Generators = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` [B, V] (float32), and its logprob (see the module's
    docstring). temperature 0: greedy."""
    if temperature == 0:
        log_probs = torch.log_softmax(logits, dim=-1)
        chosen = log_probs.argmax(dim=-1)
    else:
        scaled = logits / temperature
        log_probs = torch.log_softmax(scaled, dim=-1)
        probs = torch.softmax(top_p_filter(top_k_filter(scaled, top_k), top_p), dim=-1)
        chosen = inverse_cdf_draw(probs, generator)
    return chosen, log_probs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)


def inverse_cdf_draw(probs: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """One index per row of `probs` [B, V], drawn with probability probs[i]: the first
    index whose cumulative probability passes a uniform draw scaled to the row's total.
    One random number a row, where torch.multinomial draws one a vocabulary entry (an
    eighth of a 53-token decode at a 265-token vocabulary on the CPU). A token of
    probability 0 never passes: its cumulative value equals the one before it. With a
    generator a row, row i's draw comes from generator i alone."""
    cumulative = probs.cumsum(dim=-1)
    if isinstance(generator, Sequence):
        if len(generator) != probs.shape[0]:
            raise ValueError(f"{len(generator)} generators for {probs.shape[0]} rows")
        uniform = torch.cat([torch.rand((1, 1), generator=g, device=probs.device, dtype=cumulative.dtype) for g in generator])
    else:
        uniform = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cumulative.dtype)
    chosen = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True)
    return chosen.squeeze(-1).clamp(max=probs.shape[-1] - 1)


@dataclass
class Decoded:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"  # "stop": a stop token or text ended it


@torch.no_grad()
def decode(
    model: Any,  # a transformers causal LM
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    stop_ids: Collection[int] = frozenset(),
    stop_text: Callable[[list[int]], bool] | None = None,
    pad_id: int = 0,
    generator: Generators = None,
    each_step: Callable[[], None] | None = None,
) -> list[Decoded]:
    """Sample up to `max_new_tokens` after each prompt. A row stops after a token of
    `stop_ids` (kept in its output) or when `stop_text(tokens)` says so. `each_step` is
    called before every token (a caller's time bound raises there).

    The KV cache and the attention mask are allocated once for the whole answer (a
    static cache): a growing cache re-copies every layer's keys and values at each token,
    which was a quarter of a 53-token decode on the CPU (bench/worker_cpu.py)."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width + max_new_tokens), dtype=torch.long)
    for row_index, prompt in enumerate(prompts):
        input_ids[row_index, width - len(prompt) :] = torch.tensor(prompt)
        attention[row_index, width - len(prompt) : width] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    step_positions = (attention[:, :width].cumsum(-1) - 1).clamp(min=0)
    rows = [Decoded() for _ in prompts]
    finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    cache, step_ids, filled = static_cache(model, width + max_new_tokens), input_ids, width
    for _ in range(max_new_tokens):
        if each_step is not None:
            each_step()
        out = model(
            input_ids=step_ids,
            attention_mask=attention[:, :filled],
            position_ids=step_positions,
            past_key_values=cache,
            cache_position=torch.arange(filled - step_ids.shape[1], filled, device=device),
            use_cache=True,
            logits_to_keep=1,  # the prompt's own logits are never read: [B, prompt, V] is GBs at a real vocabulary
        )
        sampled, sampled_logprobs = draw_tokens(out.logits[:, -1].float(), temperature, top_p, top_k, generator)
        chosen, chosen_logprobs, done = sampled.tolist(), sampled_logprobs.tolist(), finished.tolist()  # one copy a step
        for index, row in enumerate(rows):
            if done[index]:
                continue
            row.tokens.append(chosen[index])
            row.logprobs.append(chosen_logprobs[index])
            if chosen[index] in stop_ids or (stop_text is not None and stop_text(row.tokens)):
                finished[index] = True
                row.finish_reason = "stop"
        if finished.all():
            break
        step_ids = torch.where(finished, torch.tensor(pad_id, device=device), sampled).unsqueeze(-1)
        attention[:, filled] = (~finished).long()
        step_positions = step_positions[:, -1:] + 1
        filled += 1
    return rows


def static_cache(model: Any, length: int) -> Any:
    """A KV cache of `length` positions, allocated on the first forward (transformers'
    StaticCache, sized from the model's own config)."""
    from transformers import StaticCache  # here: this module is imported where transformers is not needed

    return StaticCache(config=model.config, max_cache_len=length)
