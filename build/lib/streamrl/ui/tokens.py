"""A trajectory's tokens as the rollout browser shows them: each token's text, whether
it trains (loss mask), its behaviour logprob, its advantage and a colour for that
advantage; agent episodes split into their turns."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from streamrl.schema.events import unpack_float32, unpack_int32, unpack_mask


@dataclass
class TokenView:
    index: int
    token_id: int
    text: str
    trained: bool
    logprob: float
    advantage: float | None
    colour: str


@dataclass
class TurnView:
    role: str
    trained: bool
    meta: dict
    tokens: list[TokenView]


@lru_cache(maxsize=8)
def tokenizer_for(model_path: str):
    """The run's tokenizer, or None where its files are not on this machine (ids then)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError):
        return None


def advantage_colour(advantage: float | None, trained: bool, scale: float) -> str:
    """Trained tokens: green for a positive advantage, red for a negative one, stronger
    with |advantage| / scale; tokens that do not train (prompt, tool output): grey."""
    if not trained:
        return "rgba(128,128,128,0.18)"
    if advantage is None or scale <= 0:
        return "rgba(80,120,255,0.25)"
    strength = min(abs(advantage) / scale, 1.0) * 0.65 + 0.1
    return f"rgba(0,160,60,{strength:.2f})" if advantage >= 0 else f"rgba(220,40,40,{strength:.2f})"


def per_token_advantages(sample: dict | None, mask: np.ndarray) -> np.ndarray | None:
    """The sample's per-token advantages, or its sequence advantage on every trained token."""
    if sample is None:
        return None
    if sample.get("token_advantages"):
        values = unpack_float32(bytes(sample["token_advantages"]))
        if len(values) == len(mask):
            return values.astype(np.float64)
    return np.where(mask > 0, float(sample["advantage"]), 0.0)


def token_views(trajectory: dict, sample: dict | None, model_path: str | None) -> list[TokenView]:
    ids = unpack_int32(bytes(trajectory["tokens"]))
    mask = unpack_mask(bytes(trajectory["loss_mask"]))
    logprobs = unpack_float32(bytes(trajectory["logprobs"]))
    advantages = per_token_advantages(sample, mask)
    scale = float(np.abs(advantages).max()) if advantages is not None and len(advantages) else 0.0
    tokenizer = tokenizer_for(model_path) if model_path else None
    texts = [tokenizer.decode([int(i)]) for i in ids] if tokenizer is not None else [f"⟨{int(i)}⟩" for i in ids]
    views = []
    for i, token_id in enumerate(ids):
        trained = bool(mask[i]) if i < len(mask) else False
        advantage = float(advantages[i]) if advantages is not None and trained else None
        views.append(
            TokenView(
                i,
                int(token_id),
                texts[i],
                trained,
                float(logprobs[i]) if i < len(logprobs) else 0.0,
                advantage,
                advantage_colour(advantage, trained, scale),
            )
        )
    return views


def turn_views(trajectory: dict, tokens: list[TokenView]) -> list[TurnView]:
    """The tokens split by the trajectory's turns (one "sequence" turn without any)."""
    turns = trajectory.get("turns") or []
    if not turns:
        prompt = trajectory.get("prompt_length") or 0
        if prompt:
            return [TurnView("prompt", False, {}, tokens[:prompt]), TurnView("response", True, {}, tokens[prompt:])]
        return [TurnView("sequence", any(t.trained for t in tokens), {}, tokens)]
    return [
        TurnView(turn["role"], bool(turn.get("trained")), turn.get("meta") or {}, tokens[turn["start"] : turn["end"]])
        for turn in turns
    ]
