"""What a training step is made of: the step's samples as TrainItems, their staleness
split, batch-scope advantages, and the buffer a step's samples arrive in."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from kafka import TopicPartition

from streamrl.algos.advantages import advantage_scope, advantages_by_group
from streamrl.learner.batching import TrainItem
from streamrl.runtime.versions import versions_behind
from streamrl.schema.events import GroupFiltered, Sample, unpack_float32, unpack_int32, unpack_mask


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


@dataclass
class StepBuffer:
    """What has arrived for one step: samples by event id, filtered groups, offsets, and
    per group how many samples arrived of how many the processor emitted."""

    samples: dict = field(default_factory=dict)
    filtered: dict = field(default_factory=dict)
    offsets: list = field(default_factory=list)
    arrived: dict = field(default_factory=dict)  # group id -> [arrived, expected]
    complete: int = 0  # groups fully arrived (a group's samples may span several polls)

    def add(self, event, tp: TopicPartition, offset: int) -> None:
        self.offsets.append((tp, offset))
        if isinstance(event, GroupFiltered):
            if event.reason == "late":  # its group was already accounted for
                return
            if event.group_id not in self.filtered:
                self.filtered[event.group_id] = event
                self.complete += 1
        elif event.event_id not in self.samples:  # a re-emitted copy counts once
            self.samples[event.event_id] = event
            counts = self.arrived.setdefault(event.group_id, [0, event.group_size])
            counts[0] += 1
            self.complete += counts[0] == counts[1]

    @property
    def groups(self) -> set:
        return set(self.arrived) | set(self.filtered)
