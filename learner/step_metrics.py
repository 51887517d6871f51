"""Statistics of a step's trajectories that trainers record with the step (the guide's
metric names: rollout/*, grpo/*)."""

from __future__ import annotations

import numpy as np

from learner.batching import TrainItem


def _stats(prefix: str, values) -> dict[str, float]:
    values = np.asarray(list(values), dtype=np.float64)
    if values.size == 0:
        return {}
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/std": float(values.std()),
            f"{prefix}/max": float(values.max()), f"{prefix}/min": float(values.min())}


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
