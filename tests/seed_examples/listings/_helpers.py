"""What the guide's listings use and never define, supplied through their import lines
(the listings themselves are the guide's text; tests/test_seed_listings.py checks that).
Each helper does the plainest thing its name and call site say."""

from __future__ import annotations

import logging

import numpy as np
import torch

from streamrl.learner.batching import TrainItem
from streamrl.api import Batch
from tests.seed_examples.listings import s000_11, s000_13

logger = logging.getLogger("guide_listings")


def compute_my_advantages(batch: Batch) -> torch.Tensor:
    """Listing 001_09's advantage function: each row's reward on its trained tokens ([B, T])."""
    rewards = torch.as_tensor(batch.metadata["rewards"], dtype=torch.float32)
    return rewards[:, None] * batch.values["loss_mask"]


def compute_feature(trajectory) -> float:
    """Listing 001_11's per-trajectory feature: its length in tokens."""
    return float(len(trajectory.tokens))


def compute_my_metric(trajectories) -> float:
    """Listing 001_11's metric: the mean of the feature."""
    return sum(t["custom_feature"] for t in trajectories) / max(len(trajectories), 1)


def create_dummy_batch() -> Batch:
    """Listing 003_12's batch: two groups of two rows, as the learner hands one over."""
    def item(group: str, reward: float, trajectory_id: str) -> TrainItem:
        return TrainItem(tokens=np.array([5, 6, 7, 8], np.int32), mask=np.array([0, 0, 1, 1], np.uint8),
                         reward=reward, group_id=group, behaviour_logprobs=np.full(4, -2.0, np.float32),
                         trajectory_id=trajectory_id)
    items = [item("a", 1.0, "a0"), item("a", 0.0, "a1"), item("b", 1.0, "b0"), item("b", 1.0, "b1")]
    return Batch.from_items(items, pad_token_id=0)


class MyWorker(s000_13.MyWorker, s000_11.MyWorker):
    """Listing 000_12 tests a `my_worker.MyWorker` with `_format_query` and `_extract_answer`:
    the guide's two MyWorker listings (000_11's config, 000_13's answer extraction) and the
    query format the test asks for, which no listing defines."""

    def _format_query(self, task: dict) -> str:
        return f"Context: {task.get('context', '')}\n\nQuestion: {task['question']}"
