"""The stream processor: trajectories + evaluations in, samples out.

Per run, it joins each trajectory with its evaluation (by trajectory id), collects them
into groups (by group id; both topics are keyed by group id, so a group lives on one
partition of each), and when a group is complete computes its advantages with the
recipe's estimator and emits one Sample per trajectory. A group that teaches nothing
(all rewards equal) or never completes (`trajectory_pool.group_timeout_s`) is emitted as
a GroupFiltered record instead: counted in the ledger, never silently lost, and it
tells the learner that the group is accounted for. Validation groups are not trained.

It is a plain consumer loop rather than a faust agent: the embedded broker wedges a
consumer group whose member dies mid-rebalance, which a crash-and-resume design cannot
afford (docs/decisions.md). State is small and rebuilt on restart: committed offsets
never pass the first event of a group still open, so a restart re-reads every open
group; groups re-emitted after a crash carry the same event ids (idempotent downstream).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from kafka import TopicPartition

from streamrl.algos.advantages import (
    GRPO_EPSILON,
    advantage_scope,
    get_advantage_estimator,
    group_advantages,
    group_std,
    is_zero_variance,
    turn_advantages,
)
from streamrl.consumers.open_group import OpenGroup
from streamrl.runtime.bus import EventPublisher, RunReader
from streamrl.runtime.config import Recipe
from streamrl.runtime.plugins import load_module
from streamrl.runtime.settings import Settings
from streamrl.schema.events import Evaluation, GroupFiltered, Sample, Trajectory, pack_float32, unpack_int32

log = logging.getLogger("streamrl.processor")
PROCESSOR_GROUP = "streamrl-processor"  # the consumer group of both processors (this plain loop, the faust app)


def group_outcome(
    run_id: str,
    group_id: str,
    step: int,
    group_size: int,
    joined: list[tuple[Trajectory, Evaluation]],
    estimator: str,
    filter_zero_variance: bool,
    timed_out: bool = False,
    train_partial: bool = False,
    *,
    std_epsilon: float = GRPO_EPSILON,
    credit_assignment: str = "episode",
) -> list[Sample] | GroupFiltered:
    """The samples of a finished group, or why it gives none. Pure: no I/O.

    Trajectories whose rollout failed (an error, or no tokens) take no part: their reward
    of 0 says nothing about the policy, and they have nothing to train on. A batch-scope
    estimator's samples leave with advantage 0: the learner sets it over the whole step
    (algos/advantages.py) and records what it trained with in the step's record."""
    usable = [(t, e) for t, e in joined if not t.error and t.tokens]
    rewards = np.array([e.reward for _, e in usable], dtype=np.float64)

    def filtered(reason: str) -> GroupFiltered:
        return GroupFiltered(
            run_id=run_id,
            group_id=group_id,
            reason=reason,
            step=step,
            group_size=group_size,
            received=len(joined),
            rewards=[float(e.reward) for _, e in joined],
            trajectory_ids=[t.trajectory_id for t, _ in joined],
        )

    if timed_out and (not train_partial or len(usable) < 2):
        return filtered("timeout")
    if len(usable) < min(2, group_size):
        return filtered("all_failed" if joined else "timeout")
    if filter_zero_variance and group_size > 1 and is_zero_variance(rewards):
        return filtered("zero_variance")
    token_advantages: list[bytes] = [b""] * len(usable)
    if advantage_scope(estimator) == "batch":
        advantages = np.zeros(len(usable))
    elif credit_assignment == "turn":
        by_turn = [assistant_turn_rewards(t, e.reward) for t, e in usable]
        turn_values = turn_advantages([turn_rewards for turn_rewards, _ in by_turn], estimator, std_epsilon)
        advantages = np.array([values[0] if len(values) else 0.0 for values in turn_values])
        token_advantages = [
            per_token_advantages(len(unpack_int32(t.tokens)), spans, values)
            for (t, _), (_, spans), values in zip(usable, by_turn, turn_values)
        ]
    else:
        advantages = group_advantages(estimator, rewards, std_epsilon)
    mean, std = float(rewards.mean()), group_std(rewards)
    return [
        Sample(
            run_id=run_id,
            trajectory_id=t.trajectory_id,
            group_id=group_id,
            advantage=float(a),
            token_advantages=per_token,
            reward=float(e.reward),
            group_reward_mean=mean,
            group_reward_std=std,
            group_size=len(usable),
            estimator=estimator,
            weight_version=t.weight_version,
            step=step,
            tokens=t.tokens,
            loss_mask=t.loss_mask,
            logprobs=t.logprobs,
            token_versions=t.token_versions,
        )
        for (t, e), a, per_token in zip(usable, advantages, token_advantages)
    ]


def assistant_turn_rewards(trajectory: Trajectory, episode_reward: float) -> tuple[list[float], list[tuple[int, int]]]:
    """The episode's reward split by assistant turn, and each turn's token span: the
    rewards recorded on the turns (an interaction's per-turn rewards), and the rest of
    the episode's reward (the evaluator's outcome) on the last assistant turn. A
    trajectory that records no turns is one assistant turn over all of its tokens."""
    assistant = [turn for turn in trajectory.turns if turn.role == "assistant"]
    if not assistant:
        return [episode_reward], [(0, len(unpack_int32(trajectory.tokens)))]
    rewards = [float(turn.reward or 0.0) for turn in assistant]
    rewards[-1] += episode_reward - float(sum(turn.reward or 0.0 for turn in trajectory.turns))
    return rewards, [(turn.start, turn.end) for turn in assistant]


def per_token_advantages(num_tokens: int, spans: list[tuple[int, int]], values: np.ndarray) -> bytes:
    """Each turn's advantage on its tokens, 0 elsewhere (prompt, tool and user tokens do
    not train), as the Sample's float32 bytes."""
    advantages = np.zeros(num_tokens, dtype=np.float32)
    for (start, end), value in zip(spans, values):
        advantages[start:end] = value
    return pack_float32(advantages)


def load_custom_advantages(path: str | None) -> None:
    """Import a recipe's module so that its @register_advantage functions register."""
    if path:
        load_module(path)


@dataclass
class ProcessorStats:
    groups: int = 0
    samples: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0


class StreamProcessor:
    def __init__(self, settings: Settings, run_id: str, recipe: Recipe, shard: tuple[int, int] = (0, 1)):
        self.run_id = run_id
        algorithm, pool = recipe.algorithm, recipe.trajectory_pool
        load_custom_advantages(algorithm.custom_advantage_module_path)
        self.estimator = algorithm.type
        get_advantage_estimator(self.estimator)  # fail now, with the known names, not on the first group
        self.filter_zero_variance = algorithm.filter_zero_variance
        self.std_epsilon, self.credit_assignment = algorithm.grpo_std_epsilon, algorithm.credit_assignment
        self.timeout_s = pool.group_timeout_s
        self.train_partial = pool.incomplete_group_policy == "train_partial"
        self.reader = RunReader(
            settings,
            run_id,
            ["trajectories", "evaluations"],
            group_id=f"{PROCESSOR_GROUP}.{run_id}",
            shard=shard,
            stage="processor",
        )
        self.publisher = EventPublisher(settings, bundle=True, stage="processor")  # a group's samples in one record
        self.open: dict[str, OpenGroup] = {}
        self.closed: dict[str, set[str]] = {}  # group id -> the trajectory ids accounted for
        self.stats = ProcessorStats()

    def _add(self, event, tp: TopicPartition, offset: int) -> str | None:
        if event.is_val:
            return None
        accounted = self.closed.get(event.group_id)
        if accounted is not None:  # the group is done
            if isinstance(event, Trajectory) and event.trajectory_id not in accounted:
                accounted.add(event.trajectory_id)  # it came after the group timed out
                self._publish_late(event.group_id, event.step, event.group_size, [event.trajectory_id])
            else:  # a second copy (a re-run task), or the evaluation of one accounted for
                self.stats.duplicates += 1
            return None
        group = self.open.get(event.group_id)
        if group is None:
            group = self.open[event.group_id] = OpenGroup(step=event.step)
        group.add(event, (tp, offset))
        return event.group_id

    def _publish_late(self, group_id: str, step: int, group_size: int, trajectory_ids: list[str]) -> None:
        """Trajectories of a group that closed without them (timed out before they, or
        their evaluations, arrived): recorded as a `late` GroupFiltered, so that the
        ledger accounts for every trajectory; the learner does not count it."""
        log.warning("group %s closed before trajectories %s were complete: recorded as late", group_id, trajectory_ids)
        self.stats.filtered["late"] = self.stats.filtered.get("late", 0) + len(trajectory_ids)
        self.publisher.publish(
            GroupFiltered(
                run_id=self.run_id,
                group_id=group_id,
                reason="late",
                step=step,
                group_size=group_size,
                received=len(trajectory_ids),
                trajectory_ids=trajectory_ids,
            )
        )

    def _emit(self, group_id: str, timed_out: bool = False) -> None:
        group = self.open.pop(group_id)
        joined = group.joined()
        self.closed[group_id] = set(group.trajectories)
        outcome = group_outcome(
            self.run_id,
            group_id,
            group.step,
            group.group_size,
            joined,
            self.estimator,
            self.filter_zero_variance,
            timed_out,
            self.train_partial,
            std_epsilon=self.std_epsilon,
            credit_assignment=self.credit_assignment,
        )
        unjoined = sorted(set(group.trajectories) - {t.trajectory_id for t, _ in joined})
        if unjoined:  # their evaluations had not arrived
            self._publish_late(group_id, group.step, group.group_size, unjoined)
        self.stats.groups += 1
        if isinstance(outcome, GroupFiltered):
            self.stats.filtered[outcome.reason] = self.stats.filtered.get(outcome.reason, 0) + 1
            self.publisher.publish(outcome)
        else:
            self.stats.samples += len(outcome)
            for sample in outcome:
                self.publisher.publish(sample)

    def poll_once(self, timeout_ms: int = 100) -> int:
        events, dead = self.reader.poll(timeout_ms=timeout_ms, max_records=2000)
        for letter in dead:
            self.publisher.publish(letter)
        touched = set()
        for event, tp, offset in events:
            if isinstance(event, (Trajectory, Evaluation)):
                group_id = self._add(event, tp, offset)
                if group_id:
                    touched.add(group_id)
        for group_id in touched:
            group = self.open[group_id]
            if group.complete():
                self._emit(group_id)
        now = time.monotonic()
        for group_id in [g for g, grp in self.open.items() if now - grp.first_seen > self.timeout_s]:
            self._emit(group_id, timed_out=True)
        self.publisher.flush()
        if events or dead:
            self.reader.commit(
                self.reader.first_needed_offsets((tp, offset) for group in self.open.values() for tp, offset in group.held)
            )
        return len(events) + len(dead)

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> ProcessorStats:
        last = time.monotonic()
        while not stop.is_set():
            if self.poll_once():
                last = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - last > idle_exit_s and not self.open:
                break
        return self.stats

    def close(self) -> None:
        self.publisher.flush()
        self.publisher.close()
        self.reader.close()
