"""The cluster twin's model of GPUs (bench/cluster_twin.py): how long an inference GPU
takes to prefill and decode, and the learner's GPUs to train, for a dense model of a
given size. The twin runs every other part of StreamRL for real; these formulas stand in
for the model's compute only.

Defaults: an 8B dense model with Llama-3-8B's shapes, in bf16, on H100 SXM GPUs, from
the datasheet's peaks (3.35 TB/s of HBM3, 989 TFLOPS of dense bf16) at stated
efficiencies. A decode step reads the weights once and each running sequence's KV cache
(memory-bound); a prefill and a training step are compute-bound (2 and 6 FLOPs per
parameter and token). docs/benchmarks.md, "The cluster twin", compares the defaults
with published serving figures.

A run is put under the twin by the environment variable STREAMRL_CLUSTER_TWIN (this
model as JSON), which only the bench sets: a recipe cannot choose it
(runtime/recipe.py refuses `service.inference_service.backend: modelled`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass

import numpy as np

TWIN_ENV = "STREAMRL_CLUSTER_TWIN"

H100_HBM_BYTES_PER_S = 3.35e12  # H100 SXM datasheet
H100_BF16_FLOPS = 989e12  # H100 SXM datasheet, dense


@dataclass(frozen=True)
class TwinModel:
    """What the twin models; every field is printed with every result."""

    params_b: float = 8.0  # model parameters, billions (bf16: 2 bytes each)
    kv_bytes_per_token: int = 131_072  # 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
    inference_gpus: int = 8
    learner_gpus: int = 8
    max_running: int = 64  # sequences one inference GPU decodes at once (a step's share: see the bench)
    bandwidth_efficiency: float = 0.6  # of peak HBM bandwidth reached by a decode step
    prefill_mfu: float = 0.5
    train_mfu: float = 0.4
    weight_sync_s: float = 1.0  # an inference GPU's pause to take a new weight version
    prompt_tokens: tuple[int, int] = (512, 4096)  # uniform
    response_median: int = 1450  # log-normal: mean about 2,000 tokens with sigma 0.8
    response_sigma: float = 0.8
    response_max: int = 16_384
    time_scale: float = 1.0  # > 1: every modelled duration divided by it (the event path carries that many times the stream)
    seed: int = 0

    def __post_init__(self):
        """A model that cannot be is refused by field, before a process starts on it."""
        counts = ("inference_gpus", "learner_gpus", "max_running", "response_median", "response_max")
        problems = [f"{name} must be >= 1" for name in counts if getattr(self, name) < 1]
        problems += [
            f"{name} must be in (0, 1]"
            for name in ("bandwidth_efficiency", "prefill_mfu", "train_mfu")
            if not 0 < getattr(self, name) <= 1
        ]
        low, high = self.prompt_tokens
        if not 1 <= low <= high:
            problems.append(f"prompt_tokens must be (low, high) with 1 <= low <= high, got {self.prompt_tokens}")
        if self.params_b <= 0 or self.time_scale <= 0 or self.weight_sync_s < 0 or self.response_sigma < 0:
            problems.append("params_b and time_scale must be > 0; weight_sync_s and response_sigma >= 0")
        if problems:
            raise ValueError(f"{TWIN_ENV}: {'; '.join(problems)}")

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TwinModel:
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{TWIN_ENV}: not JSON ({exc})") from None
        if not isinstance(fields, dict):
            raise ValueError(f"{TWIN_ENV}: expected a JSON object of TwinModel's fields")
        if "prompt_tokens" in fields:
            fields["prompt_tokens"] = tuple(fields["prompt_tokens"])
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{TWIN_ENV}: unknown fields {unknown}")
        return cls(**fields)

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2


def twin_from_env() -> TwinModel | None:
    """The twin's model where the bench set it, else None (a real run)."""
    text = os.environ.get(TWIN_ENV)
    return TwinModel.from_json(text) if text else None


def decode_step_s(model: TwinModel, context_tokens):
    """One decode step of sequences holding `context_tokens` tokens of KV cache in all
    (a number, or an array of them, one a GPU): the weights and the cache read once, at
    the reached bandwidth."""
    read = model.weight_bytes + model.kv_bytes_per_token * context_tokens
    return read / (H100_HBM_BYTES_PER_S * model.bandwidth_efficiency) / model.time_scale


def prefill_s(model: TwinModel, prompt_tokens: int) -> float:
    return 2 * model.params_b * 1e9 * prompt_tokens / (H100_BF16_FLOPS * model.prefill_mfu) / model.time_scale


def train_s(model: TwinModel, tokens: int) -> float:
    """A training step over `tokens` tokens on the learner's GPUs (forward and backward)."""
    flops = H100_BF16_FLOPS * model.train_mfu * model.learner_gpus
    return 6 * model.params_b * 1e9 * tokens / flops / model.time_scale


def response_lengths(model: TwinModel, rng: np.random.Generator, count: int) -> np.ndarray:
    """Long-tailed response lengths (log-normal), 1 to response_max tokens."""
    drawn = rng.lognormal(math.log(model.response_median), model.response_sigma, count)
    return np.clip(np.rint(drawn), 1, model.response_max).astype(np.int64)


def mean_response(model: TwinModel) -> float:
    """The mean of `response_lengths`, by sampling (the clip moves it off the closed form)."""
    return float(response_lengths(model, np.random.default_rng(12345), 200_000).mean())


def mean_decode_context(model: TwinModel) -> float:
    """The KV cache one generated token reads, on average over every token generated: its
    prompt and the answer before it. An answer of L tokens reads prompt + 0, 1, ..., L - 1,
    so per token this is prompt + E[L(L - 1)] / (2 E[L]), not prompt + E[L] / 2: the long
    answers hold most of the tokens (with sigma 0.8, about prompt + 0.95 E[L])."""
    lengths = response_lengths(model, np.random.default_rng(12345), 200_000).astype(np.float64)
    return sum(model.prompt_tokens) / 2 + float((lengths * (lengths - 1)).mean() / (2 * lengths.mean()))


def ideal_rollouts_per_s(model: TwinModel, group_size: int, rollouts_per_step: int) -> dict[str, float]:
    """The schedule-free bounds: generation with every inference GPU decoding full
    batches, each sequence holding the context a generated token reads on average (so the
    decode work is what the answers' lengths make it, whatever the order), and pausing
    for a weight version every step of `rollouts_per_step`; training at its modelled
    rate; and the sync schedule (the two one after the other, no overlap)."""
    prompt = sum(model.prompt_tokens) / 2
    response = mean_response(model)
    context = model.max_running * mean_decode_context(model)
    per_gpu_tokens_s = model.max_running / decode_step_s(model, context)
    # a GPU's time per rollout: its share of decode steps, its prompt's prefill shared by
    # its group, and its share of the step's weight-sync pause
    pause_s = model.weight_sync_s / model.time_scale * model.inference_gpus / rollouts_per_step
    generate_s = response / per_gpu_tokens_s + prefill_s(model, int(prompt)) / group_size + pause_s
    generation = model.inference_gpus / generate_s
    training = 1 / train_s(model, int(prompt + response))
    return {
        "generation": generation,
        "training": training,
        "async": min(generation, training),
        "sync": 1 / (1 / generation + 1 / training),
    }
