"""What a training step is made of: the step's samples as TrainItems, their staleness
split and batch-scope advantages (learner/step_groups.py: which samples a step takes)."""

from __future__ import annotations

import numpy as np

from streamrl.algos.advantages import advantage_scope, advantages_by_group
from streamrl.learner.batching import TrainItem
from streamrl.runtime.versions import versions_behind
from streamrl.schema.events import Sample, unpack_float32, unpack_int32, unpack_mask


def sample_to_item(sample: Sample) -> TrainItem:
    advantages = unpack_float32(sample.token_advantages) if sample.token_advantages else None
    return TrainItem(
        tokens=unpack_int32(sample.tokens),
        mask=unpack_mask(sample.loss_mask),
        behaviour_logprobs=unpack_float32(sample.logprobs),
        advantage=sample.advantage,
        token_advantages=advantages,
        weight_version=sample.weight_version,
        trajectory_id=sample.trajectory_id,
        reward=sample.reward,
        group_id=sample.group_id,
        token_versions=unpack_int32(sample.token_versions) if sample.token_versions else None,
    )


def with_behaviour_lag(items: list[TrainItem], learner_version: int) -> list[TrainItem]:
    """Each token's distance from the learner's weights: how many versions older the
    weights that sampled it are (the logprob-gap metric is broken down by it)."""
    for item in items:
        versions = (
            item.token_versions if item.token_versions is not None else np.full(len(item.tokens), item.weight_version, np.int32)
        )
        item.behaviour_lag = (learner_version - versions).astype(np.int32)
    return items


def with_batch_advantages(kept: list[TrainItem], algorithm, metrics: dict[str, float]) -> list[float]:
    """A batch-scope estimator (`algorithm.type`, e.g. reinforce_plus_plus) sets the
    advantages of the samples the step trains, over all of them at once: the learner is
    where a whole step meets. Returns them, in the order of `kept`, for the step's record
    (empty for a group-scope estimator, whose advantages the samples already carry)."""
    if not kept or advantage_scope(algorithm.type) != "batch":
        return []
    advantages = advantages_by_group(
        [i.group_id for i in kept], [i.reward for i in kept], [float(i.mask.sum()) for i in kept], algorithm.type
    )
    for item, advantage in zip(kept, advantages):
        item.advantage, item.token_advantages = float(advantage), None
    metrics["batch_advantage_abs_mean"] = float(np.abs(advantages).mean())
    return [float(a) for a in advantages]


def staleness_split(
    items: list[TrainItem], learner_version: int, threshold: float, sync_every: int = 1
) -> tuple[list[TrainItem], list[TrainItem]]:
    """(kept, dropped): a sample is stale when its behaviour version is more than
    `threshold` published versions (one every `sync_every` steps) behind the weights
    about to be updated, those after step `learner_version`."""
    kept = [i for i in items if versions_behind(learner_version, i.weight_version, sync_every) <= threshold]
    dropped = [i for i in items if versions_behind(learner_version, i.weight_version, sync_every) > threshold]
    return kept, dropped


def staleness_split_at_generation(
    items: list[TrainItem], published_steps: dict[str, int], threshold: float, sync_every: int = 1
) -> tuple[list[TrainItem], list[TrainItem]]:
    """(kept, dropped) for trajectory_pool.batch_groups first_complete: the bound counted
    from the step each sample's group was published for (the versions its tasks were
    paced by), not the step that trains it, so a slow group trained later is kept. What
    it drops is what a lagging worker sampled with weights older than its pacing."""
    stale = {
        i.trajectory_id
        for i in items
        if versions_behind(published_steps[i.group_id] - 1, i.weight_version, sync_every) > threshold
    }
    return [i for i in items if i.trajectory_id not in stale], [i for i in items if i.trajectory_id in stale]
