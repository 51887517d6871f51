"""Statistics of a step's trajectories that trainers record with the step (the guide's
metric names: rollout/*, grpo/*)."""

from __future__ import annotations

import numpy as np
import torch

from streamrl.algos.losses import masked
from streamrl.learner.batching import TrainItem


def _stats(prefix: str, values) -> dict[str, float]:
    values = np.asarray(list(values), dtype=np.float64)
    if values.size == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/std": float(values.std()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def log_rollout_metrics(trajectories: list[TrainItem], metrics: dict) -> dict:
    """Reward and response-length statistics of the step's trajectories, into `metrics`."""
    metrics.update(_stats("rollout/reward", (t.reward for t in trajectories)))
    metrics.update(_stats("rollout/response_length", (int(t.mask.sum()) for t in trajectories)))
    return metrics


def log_grpo_metrics(trajectories: list[TrainItem], metrics: dict) -> dict:
    """Advantage statistics and the number of groups, into `metrics`."""
    metrics.update(_stats("grpo/advantage", (t.advantage for t in trajectories)))
    metrics["grpo/groups"] = float(len({t.group_id for t in trajectories}))
    return metrics


LAG_BUCKETS = {"lag0": (0, 0), "lag1": (1, 1), "lag2plus": (2, None)}


def logprob_gap_sums(
    logprobs: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, lag: torch.Tensor
) -> dict[str, torch.Tensor]:
    """|learner logprob - behaviour logprob| over the trained tokens: its sum and maximum,
    and per lag bucket (tokens sampled by the learner's own weights, one version behind,
    two or more) its sum, maximum and token count. At lag 0 the two logprobs come from
    the same weights, so a gap there is inference/training mismatch, not policy change."""
    gap = masked((logprobs - behaviour).abs(), mask)
    sums = {"logprob_gap_mean_sum": gap.sum(), "logprob_gap_max": gap.max()}
    lag = lag.to(gap.device)
    for name, (low, high) in LAG_BUCKETS.items():
        inside = (lag >= low) if high is None else (lag >= low) & (lag <= high)
        in_mask = mask * inside
        sums[f"gap_{name}"] = (gap * in_mask).sum()
        sums[f"tokens_{name}"] = in_mask.sum()
        sums[f"gap_{name}_max"] = (gap * in_mask).max()
    return sums


def logprob_gap_by_lag(lag_sums: dict[str, float]) -> dict[str, float]:
    """Per-bucket mean gaps and token counts from `logprob_gap_sums`' step totals
    (a bucket with no tokens has no mean)."""
    metrics = {}
    for name in LAG_BUCKETS:
        tokens = lag_sums.get(f"tokens_{name}", 0.0)
        metrics[f"tokens_{name}"] = tokens
        if tokens:
            metrics[f"logprob_gap_mean_{name}"] = lag_sums[f"gap_{name}"] / tokens
            metrics[f"logprob_gap_max_{name}"] = lag_sums[f"gap_{name}_max"]
    return metrics
