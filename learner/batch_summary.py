"""A training step's batch, summarised under the names verl logs (where verl has one) so
that a verl or TRL user finds the numbers they read: response lengths and how many hit
the limit, the scores and their spread, how many groups had nothing to learn from, and
where the step's time went. Pure functions over the step's samples; the learner's loop
adds them to the step's record (the ledger's `train_steps.metrics`, the trackers, the
summary)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from streamrl.learner.batching import TrainItem


def batch_metrics(items: list[TrainItem], max_response_length: int, groups: int, zero_std_filtered: int) -> dict[str, float]:
    """`items`: every sample of the step (trained or dropped as stale); `groups`: the
    step's groups, filtered ones included; `zero_std_filtered`: groups left out of the
    step because their rewards were all equal."""
    if not items:
        return {"groups/zero_std_share": zero_std_filtered / groups if groups else 0.0}
    response = np.array([int(item.mask.sum()) for item in items], dtype=np.float64)
    prompt = np.array([len(item.tokens) - int(item.mask.sum()) for item in items], dtype=np.float64)
    scores = np.array([item.reward for item in items], dtype=np.float64)
    by_group: dict[str, list[float]] = defaultdict(list)
    for item in items:
        by_group[item.group_id].append(item.reward)
    zero_std_trained = sum(1 for rewards in by_group.values() if len(rewards) > 1 and np.std(rewards) == 0)
    return {
        "response_length/mean": float(response.mean()),
        "response_length/max": float(response.max()),
        "response_length/min": float(response.min()),
        "response_length/clip_ratio": float(np.mean(response >= max_response_length)),
        "prompt_length/mean": float(prompt.mean()),
        "critic/score/mean": float(scores.mean()),
        "critic/score/max": float(scores.max()),
        "critic/score/min": float(scores.min()),
        "critic/score/std": float(scores.std()),
        "groups/zero_std_share": (zero_std_trained + zero_std_filtered) / groups if groups else 0.0,
    }


def timing_metrics(wait_s: float, update_s: float, response_tokens: int, trained_tokens: int) -> dict[str, float]:
    """Where the step's wall-clock went: waiting for its samples (in sync mode, the
    rollouts' generation: verl's `timing_s/gen`) and the optimizer update; tokens per
    second of each."""
    step_s = wait_s + update_s
    return {
        "timing_s/wait": wait_s,
        "timing_s/update_actor": update_s,
        "timing_s/step": step_s,
        "perf/rollout_tokens_per_s": response_tokens / step_s if step_s > 0 else 0.0,
        "perf/learner_tokens_per_s": trained_tokens / update_s if update_s > 0 else 0.0,
    }
