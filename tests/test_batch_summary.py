"""The step metrics a verl or TRL user reads (learner/batch_summary.py), on a hand-made
batch whose values were worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from streamrl.learner.batch_summary import batch_metrics, timing_metrics
from streamrl.learner.batching import TrainItem


def item(prompt: int, response: int, reward: float, group: str) -> TrainItem:
    mask = np.array([0] * prompt + [1] * response, dtype=np.uint8)
    return TrainItem(
        tokens=np.zeros(prompt + response, np.int32),
        mask=mask,
        behaviour_logprobs=np.zeros(len(mask), np.float32),
        reward=reward,
        group_id=group,
    )


def test_batch_metrics_under_verls_names():
    # group a: rewards 1, 0 (spread); group b: 1, 1 (zero std); one more zero-variance
    # group was filtered out before the step: 2 of 3 groups had nothing to learn from
    items = [item(3, 4, 1.0, "a"), item(3, 8, 0.0, "a"), item(5, 8, 1.0, "b"), item(5, 2, 1.0, "b")]
    got = batch_metrics(items, max_response_length=8, groups=3, zero_std_filtered=1)
    assert got == {
        "response_length/mean": 5.5,  # (4 + 8 + 8 + 2) / 4
        "response_length/max": 8.0,
        "response_length/min": 2.0,
        "response_length/clip_ratio": 0.5,  # two of four at the limit
        "prompt_length/mean": 4.0,
        "critic/score/mean": 0.75,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "critic/score/std": pytest.approx(np.sqrt(0.1875)),  # population std of 1, 0, 1, 1
        "groups/zero_std_share": pytest.approx(2 / 3),
    }


def test_timing_splits_the_step_and_gives_tokens_per_second():
    assert timing_metrics(wait_s=3.0, update_s=1.0, response_tokens=400, trained_tokens=600) == {
        "timing_s/wait": 3.0,
        "timing_s/update_actor": 1.0,
        "timing_s/step": 4.0,
        "perf/rollout_tokens_per_s": 100.0,
        "perf/learner_tokens_per_s": 600.0,
    }
