"""Synthetic events of every type, deterministic in (run_id, index).

Used by the sink tests, the benchmarks and `streamrl demo`: realistic shapes (packed
token arrays, JSON metrics, GRPO groups) without a model. Index i of every type refers
to the same rollout, so the events of one index form a consistent story.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from streamrl.schema.events import (
    DeadLetter,
    Evaluation,
    Event,
    RunEvent,
    Sample,
    Task,
    TrainStep,
    Trajectory,
    WeightVersion,
    pack_float32,
    pack_int32,
    pack_mask,
)

GROUP_SIZE = 8


def _ids(index: int) -> tuple[str, str, str]:
    group = index // GROUP_SIZE
    return f"t{index}", f"g{group}", f"traj{index}"


def synthetic_task(run_id: str, index: int) -> Task:
    task_id, group_id, _ = _ids(index)
    a, b = index % 97, (index * 7) % 89
    return Task(
        run_id=run_id,
        task_id=task_id,
        group_id=group_id,
        sample_index=index % GROUP_SIZE,
        group_size=GROUP_SIZE,
        prompt=f"{a}+{b}=",
        data={"a": a, "b": b, "answer": a + b},
        step=index // 64,
    )


def synthetic_trajectory(run_id: str, index: int, num_tokens: int = 64) -> Trajectory:
    task_id, group_id, trajectory_id = _ids(index)
    rng = np.random.default_rng(index)
    prompt_length = num_tokens // 4
    mask = np.zeros(num_tokens, dtype=np.uint8)
    mask[prompt_length:] = 1
    return Trajectory(
        run_id=run_id,
        trajectory_id=trajectory_id,
        task_id=task_id,
        group_id=group_id,
        sample_index=index % GROUP_SIZE,
        weight_version=index // 64,
        tokens=pack_int32(rng.integers(0, 32_000, num_tokens)),
        loss_mask=pack_mask(mask),
        logprobs=pack_float32(-rng.random(num_tokens) * mask),
        prompt_length=prompt_length,
        prompt_text="What is 2+2?",
        response_text="4",
        finish_reason="stop",
        timings={"generate_s": 0.01},
        worker_id="synthetic",
        step=index // 64,
    )


def synthetic_evaluation(run_id: str, index: int) -> Evaluation:
    task_id, group_id, trajectory_id = _ids(index)
    reward = float(index % 3 == 0)
    return Evaluation(
        run_id=run_id,
        trajectory_id=trajectory_id,
        task_id=task_id,
        group_id=group_id,
        reward=reward,
        metrics={"accuracy": reward},
        ground_truth="4",
        evaluator="synthetic",
        step=index // 64,
    )


def synthetic_sample(run_id: str, index: int, num_tokens: int = 64) -> Sample:
    trajectory = synthetic_trajectory(run_id, index, num_tokens)
    return Sample(
        run_id=run_id,
        trajectory_id=trajectory.trajectory_id,
        group_id=trajectory.group_id,
        advantage=(index % 5 - 2) / 2,
        reward=float(index % 3 == 0),
        group_reward_mean=0.375,
        group_reward_std=0.48,
        group_size=GROUP_SIZE,
        estimator="grpo",
        weight_version=trajectory.weight_version,
        step=trajectory.step,
        tokens=trajectory.tokens,
        loss_mask=trajectory.loss_mask,
        logprobs=trajectory.logprobs,
    )


def synthetic_train_step(run_id: str, index: int) -> TrainStep:
    return TrainStep(
        run_id=run_id,
        step=index,
        weight_version=index + 1,
        loss=0.1,
        kl=0.01,
        entropy=1.2,
        clip_fraction=0.05,
        grad_norm=0.7,
        lr=1e-5,
        tokens=4096,
        samples=64,
        sample_ids=[f"traj{index * 64 + k}" for k in range(4)],
        staleness={"mean": 0.5, "max": 1.0, "dropped": 0.0},
        seconds=0.2,
        consumed_offsets={f"streamrl.{run_id}.samples:0": index * 64},
        metrics={"reward": 0.4},
    )


def synthetic_weight_version(run_id: str, index: int) -> WeightVersion:
    return WeightVersion(run_id=run_id, version=index + 1, step=index, uri=f"/ckpt/v{index + 1}", sha256=f"{index:064x}")


def synthetic_run_event(run_id: str, index: int) -> RunEvent:
    return RunEvent(
        run_id=run_id,
        kind="resumed" if index else "created",
        sequence=index,
        name=run_id,
        config={"synthetic": True} if index == 0 else {},
    )


def synthetic_dead_letter(run_id: str, index: int) -> DeadLetter:
    return DeadLetter(
        run_id=run_id,
        source_topic=f"streamrl.{run_id}.tasks",
        source_partition=0,
        source_offset=1_000_000 + index,
        raw=b"\xff" * 16,
        error="synthetic",
        stage="synthetic",
    )


SYNTHETIC: dict[str, Callable[[str, int], Event]] = {
    "Task": synthetic_task,
    "Trajectory": synthetic_trajectory,
    "Evaluation": synthetic_evaluation,
    "Sample": synthetic_sample,
    "TrainStep": synthetic_train_step,
    "WeightVersion": synthetic_weight_version,
    "RunEvent": synthetic_run_event,
    "DeadLetter": synthetic_dead_letter,
}


def synthetic_events(run_id: str, count: int, types: list[str] | None = None):
    """`count` events of each requested type, interleaved by index."""
    makers = [SYNTHETIC[t] for t in (types or SYNTHETIC)]
    for index in range(count):
        for make in makers:
            event: Event = make(run_id, index)
            yield event
