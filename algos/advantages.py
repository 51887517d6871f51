"""Advantage estimators, as small pure functions selected by name (`algorithm.type`).

One registry, two kinds, one signature per kind:

    group scope (the default): fn(rewards) -> advantages
        the rewards of one group (all samples of one prompt) in, one advantage per sample
        out; the stream processor computes them as each group completes.
    batch scope (`register_batch_advantage`): fn(group_rewards, group_token_counts) -> advantages
        every group of one training step in (a list of reward arrays and, beside them,
        each sample's count of trained tokens), one advantage array per group out. They
        need the whole step (REINFORCE++ whitens over all of its tokens), and the one
        place a whole step meets is the learner (processors share a run's partitions), so
        the learner computes them over the samples it is about to train
        (`learner/step_inputs.py`, `with_batch_advantages`); replay recomputes them the same way.

A recipe adds its own with `@register_advantage("name")` (or
`@register_batch_advantage("name")`) in the file `algorithm.custom_advantage_module_path`
names.

Convention for the GRPO standard deviation: the *sample* standard deviation (Bessel's
n - 1), as TRL's GRPOTrainer and verl use (`torch.std`), so advantages are comparable
with theirs. It is the same on every path (stream processor, replay, custom trainers).
A group of one sample has no spread: its GRPO advantage is 0. The epsilon added to the
std is verl's 1e-6 by default; `algorithm.grpo_std_epsilon: 1e-4` is TRL's.

Every group estimator built in has the form (r_i - b_i) / s: a baseline b_i and a scale s
from the group's rewards. `GROUP_BASELINES` holds that form, by the estimator's name;
turn-level credit (`turn_advantages`) needs it, since a later turn's return is measured
against the same baseline and scale as the episode's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from streamrl.runtime.registry import Registry

AdvantageFn = Callable[..., Any]
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator", "algorithm.type")
register_advantage = ADVANTAGE_ESTIMATORS.register
get_advantage_estimator = ADVANTAGE_ESTIMATORS.get

# estimator name -> fn(rewards) -> (baselines, scale): the (r - b) / s form of a group estimator
BaselineFn = Callable[[np.ndarray], tuple[np.ndarray, float]]
GROUP_BASELINES: dict[str, BaselineFn] = {}

GRPO_EPSILON = 1e-6  # verl's
TRL_STD_EPSILON = 1e-4  # TRL GRPOTrainer's
WHITEN_EPSILON = 1e-8  # verl's masked_whiten


def register_batch_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register a batch-scope estimator: fn(group_rewards, group_token_counts) -> advantages."""

    def add(fn: AdvantageFn) -> AdvantageFn:
        fn.advantage_scope = "batch"  # type: ignore[attr-defined]  # a marker that advantage_scope() reads back
        return register_advantage(name)(fn)

    return add


def advantage_scope(name: str) -> Literal["group", "batch"]:
    """Which kind the estimator `name` is: "group" (the processor) or "batch" (the learner)."""
    return getattr(get_advantage_estimator(name), "advantage_scope", "group")


def group_std(rewards: np.ndarray) -> float:
    """Sample standard deviation (n - 1); 0 for a group of one."""
    return float(np.std(rewards, ddof=1)) if len(rewards) > 1 else 0.0


def _as_rewards(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(rewards, dtype=np.float64)


# --- group scope: the (r - b) / s form and the estimators built on it ---------------------


def grpo_baseline(rewards: np.ndarray, epsilon: float = GRPO_EPSILON) -> tuple[np.ndarray, float]:
    rewards = _as_rewards(rewards)
    return np.full(len(rewards), rewards.mean()), group_std(rewards) + epsilon


def mean_baseline(rewards: np.ndarray) -> tuple[np.ndarray, float]:
    rewards = _as_rewards(rewards)
    return np.full(len(rewards), rewards.mean()), 1.0


def leave_one_out_baseline(rewards: np.ndarray) -> tuple[np.ndarray, float]:
    rewards = _as_rewards(rewards)
    n = len(rewards)
    if n < 2:  # no other sample: the baseline is the sample itself, its advantage 0
        return rewards.copy(), 1.0
    return (rewards.sum() - rewards) / (n - 1), 1.0


def no_baseline(rewards: np.ndarray) -> tuple[np.ndarray, float]:
    return np.zeros(len(rewards)), 1.0


GROUP_BASELINES.update(grpo=grpo_baseline, dr_grpo=mean_baseline, rloo=leave_one_out_baseline, reinforce=no_baseline)


@register_advantage("grpo")
def grpo_advantages(rewards: np.ndarray, epsilon: float = GRPO_EPSILON) -> np.ndarray:
    """DeepSeekMath GRPO: (r_i - mean(r)) / (std(r) + epsilon)."""
    baselines, scale = grpo_baseline(rewards, epsilon)
    return np.asarray((_as_rewards(rewards) - baselines) / scale)


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """Dr. GRPO: r_i - mean(r), no division by the std (which favours easy and hard prompts)."""
    return np.asarray(_as_rewards(rewards) - mean_baseline(rewards)[0])


@register_advantage("rloo")
def rloo_advantages(rewards: np.ndarray) -> np.ndarray:
    """REINFORCE leave-one-out: r_i - mean of the other samples' rewards (0 alone)."""
    return np.asarray(_as_rewards(rewards) - leave_one_out_baseline(rewards)[0])


@register_advantage("reinforce")
def reinforce_advantages(rewards: np.ndarray) -> np.ndarray:
    """Plain REINFORCE: the reward itself, no baseline."""
    return _as_rewards(rewards).copy()


def group_advantages(estimator: str, rewards: np.ndarray, std_epsilon: float = GRPO_EPSILON) -> np.ndarray:
    """A group-scope estimator on one group's rewards (grpo with the recipe's std epsilon):
    the one place `algorithm.grpo_std_epsilon` reaches an estimator."""
    if estimator == "grpo":
        return np.asarray(grpo_advantages(rewards, std_epsilon))
    return np.asarray(get_advantage_estimator(estimator)(rewards))


def is_zero_variance(rewards: Sequence[float] | np.ndarray) -> bool:
    """A group whose samples all scored the same teaches nothing group-relative."""
    return len(rewards) == 0 or float(np.ptp(np.asarray(rewards, dtype=np.float64))) == 0.0


# --- turn-level credit for multi-turn episodes -------------------------------------------


def returns_to_go(turn_rewards: Sequence[float]) -> np.ndarray:
    """G_k = r_k + r_{k+1} + ... (gamma = 1): the return from each assistant turn on."""
    return np.cumsum(np.asarray(turn_rewards, dtype=np.float64)[::-1])[::-1].copy()


def turn_advantages(group_turn_rewards: list[Sequence[float]], estimator: str, epsilon: float = GRPO_EPSILON) -> list[np.ndarray]:
    """Per sample of one group, the advantage of each assistant turn: (G_ik - b_i) / s,
    with G_ik the sample's return from turn k on and b_i, s the estimator's baseline and
    scale over the group's episode returns G_i0. The first turn's advantage is the
    episode's (what `estimator` gives); a later turn is not credited with rewards earned
    before it. Each sample's rewards are by assistant turn, the last turn's including the
    evaluator's outcome reward."""
    if estimator not in GROUP_BASELINES:
        raise ValueError(
            f"turn-level credit needs an estimator of the (r - b) / s form "
            f"({', '.join(sorted(GROUP_BASELINES))}), not {estimator!r}"
        )
    returns = [returns_to_go(rewards) for rewards in group_turn_rewards]
    episode_returns = np.array([g[0] if len(g) else 0.0 for g in returns])
    baselines, scale = (
        grpo_baseline(episode_returns, epsilon) if estimator == "grpo" else GROUP_BASELINES[estimator](episode_returns)
    )
    return [(g - b) / scale for g, b in zip(returns, baselines)]


# --- batch scope: over every group of a step ---------------------------------------------


def token_weighted_whiten(
    values: list[np.ndarray], token_counts: list[np.ndarray], epsilon: float = WHITEN_EPSILON
) -> list[np.ndarray]:
    """(v - mu) / sqrt(var + epsilon), mu and var over the step's trained *tokens*: each
    sample's value counted once per token it trains, var with Bessel's correction (verl's
    `masked_whiten` on a sequence-level value broadcast over the response mask). One token
    or none in all: no spread to divide by, all zeros."""
    flat = np.concatenate([np.asarray(v, dtype=np.float64) for v in values]) if values else np.zeros(0)
    counts = np.concatenate([np.asarray(c, dtype=np.float64) for c in token_counts]) if values else np.zeros(0)
    total = counts.sum()
    if total <= 1:
        return [np.zeros(len(v)) for v in values]
    mean = float((flat * counts).sum() / total)
    var = float((counts * (flat - mean) ** 2).sum() / (total - 1))
    scale = 1.0 / np.sqrt(var + epsilon)
    return [(np.asarray(v, dtype=np.float64) - mean) * scale for v in values]


@register_batch_advantage("reinforce_plus_plus")
def reinforce_plus_plus_advantages(group_rewards: list[np.ndarray], group_token_counts: list[np.ndarray]) -> list[np.ndarray]:
    """REINFORCE++ (Hu 2025): the return (the outcome reward on every token, gamma = 1),
    whitened over the step's trained tokens; no group baseline."""
    return token_weighted_whiten([_as_rewards(r) for r in group_rewards], group_token_counts)


@register_batch_advantage("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantages(
    group_rewards: list[np.ndarray], group_token_counts: list[np.ndarray]
) -> list[np.ndarray]:
    """REINFORCE++-baseline: r_i - mean of its group (a group of one keeps its reward, as
    verl does), then whitened over the step's trained tokens."""
    centred = []
    for rewards in group_rewards:
        rewards = _as_rewards(rewards)
        centred.append(rewards - rewards.mean() if len(rewards) > 1 else rewards.copy())
    return token_weighted_whiten(centred, group_token_counts)


# --- one helper for every caller that holds rows of several groups -----------------------


def advantages_by_group(
    group_ids: Sequence[str],
    rewards: Sequence[float],
    token_counts: Sequence[float],
    estimator: str,
    std_epsilon: float = GRPO_EPSILON,
) -> np.ndarray:
    """One advantage per row, rows grouped by `group_ids` (in first-seen order), by the
    estimator `estimator` of either scope: a group estimator on each group's rewards, a
    batch estimator on all of them at once (`token_counts`: each row's trained tokens)."""
    rows_of: dict[str, list[int]] = {}
    for row, group_id in enumerate(group_ids):
        rows_of.setdefault(group_id, []).append(row)
    reward_array = np.asarray(rewards, dtype=np.float64)
    counts = np.asarray(token_counts, dtype=np.float64)
    groups = list(rows_of.values())
    if advantage_scope(estimator) == "batch":
        values = get_advantage_estimator(estimator)([reward_array[rows] for rows in groups], [counts[rows] for rows in groups])
    else:
        values = [group_advantages(estimator, reward_array[rows], std_epsilon) for rows in groups]
    advantages = np.zeros(len(reward_array))
    for rows, group_values in zip(groups, values):
        advantages[rows] = group_values
    return advantages
