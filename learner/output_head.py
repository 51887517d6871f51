"""The output layer run a chunk of positions at a time (`chunked_token_logprobs_and_entropy`
in algos/losses.py): the model's forward returns its last hidden states instead of logits
(its head swapped for an identity for the call), and the loss code applies the head.

Only where that is exactly what the model's forward would do: one unsharded process (an
FSDP2 root owns the head's shards), a plain `nn.Linear` head (not a LoRA-wrapped one),
and no transformation after the head (Gemma's logit soft-capping, a logit scale)."""

from __future__ import annotations

import contextlib

import torch

from streamrl.algos.losses import chunked_token_logprobs_and_entropy, token_logprobs_and_entropy

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def chunkable_head(model: torch.nn.Module, sharded: bool) -> torch.nn.Linear | None:
    """The model's output layer where its logits may be computed in chunks, else None."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) and not sharded else None
    if type(head) is not torch.nn.Linear:
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) for name in LOGIT_TRANSFORMS):
        return None
    return head


@contextlib.contextmanager
def hidden_states_out(model: torch.nn.Module, head: torch.nn.Linear):
    """Within: `model(...).logits` are the final hidden states [B, T, H]."""
    model.set_output_embeddings(torch.nn.Identity())  # type: ignore[operator]  # transformers' method
    try:
        yield
    finally:
        model.set_output_embeddings(head)  # type: ignore[operator]


def head_logprobs(out: torch.Tensor, tokens: torch.Tensor, head: torch.nn.Linear | None, temperature: float, autocast):
    """Log-softmax and entropy in float32, whatever the compute dtype: from the logits
    `out`, or (with `head`) from the final hidden states `out`, a chunk of positions at a
    time, the head's matmul under `autocast()` as in the model's own forward."""
    if head is None:
        return token_logprobs_and_entropy(out, tokens, temperature)
    with autocast():
        return chunked_token_logprobs_and_entropy(out, head.weight, head.bias, tokens, temperature)
