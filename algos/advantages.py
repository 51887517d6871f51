"""Group-relative advantage estimators, as small pure functions selected by name
(`algorithm.type`).

Signature: `fn(rewards: np.ndarray) -> np.ndarray`, the rewards of one group (all
samples of one prompt) in, one scalar advantage per sample out. A recipe adds its own
with `@register_advantage("name")` in the file `algorithm.custom_advantage_module_path`
names.

Convention for the GRPO standard deviation: the *sample* standard deviation (Bessel's
n - 1), as TRL's GRPOTrainer and verl use (`torch.std`), so advantages are comparable
with theirs. It is the same on every path (stream processor, replay, custom trainers).
A group of one sample has no spread: its GRPO advantage is 0.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from runtime.registry import Registry

AdvantageFn = Callable[[np.ndarray], np.ndarray]
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator", "algorithm.type")
register_advantage = ADVANTAGE_ESTIMATORS.register
get_advantage_estimator = ADVANTAGE_ESTIMATORS.get

GRPO_EPSILON = 1e-6


def group_std(rewards: np.ndarray) -> float:
    """Sample standard deviation (n - 1); 0 for a group of one."""
    return float(np.std(rewards, ddof=1)) if len(rewards) > 1 else 0.0


@register_advantage("grpo")
def grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """DeepSeekMath GRPO: (r_i - mean(r)) / (std(r) + eps)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return (rewards - rewards.mean()) / (group_std(rewards) + GRPO_EPSILON)


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """Dr. GRPO: r_i - mean(r), no division by the std (which favours easy and hard prompts)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return rewards - rewards.mean()


@register_advantage("rloo")
def rloo_advantages(rewards: np.ndarray) -> np.ndarray:
    """REINFORCE leave-one-out: r_i - mean of the other samples' rewards."""
    rewards = np.asarray(rewards, dtype=np.float64)
    n = len(rewards)
    if n < 2:
        return np.zeros_like(rewards)
    return rewards - (rewards.sum() - rewards) / (n - 1)


@register_advantage("reinforce")
def reinforce_advantages(rewards: np.ndarray) -> np.ndarray:
    """Plain REINFORCE: the reward itself, no baseline."""
    return np.asarray(rewards, dtype=np.float64).copy()


def is_zero_variance(rewards: Sequence[float]) -> bool:
    """A group whose samples all scored the same teaches nothing group-relative."""
    return len(rewards) == 0 or float(np.ptp(np.asarray(rewards, dtype=np.float64))) == 0.0
