"""The stream processor's group maths (pure) against hand-computed values."""

import math

import pytest

from streamrl.consumers.processor import group_outcome
from streamrl.schema.events import Evaluation, GroupFiltered, Sample, Trajectory, pack_float32, pack_int32, pack_mask


def member(i, reward, error=None, version=3):
    tokens = b"" if error else pack_int32([5, 6, 7])
    t = Trajectory(
        run_id="r",
        trajectory_id=f"g-{i}",
        task_id=f"g-{i}",
        group_id="g",
        sample_index=i,
        group_size=4,
        weight_version=version,
        tokens=tokens,
        loss_mask=pack_mask([0, 1, 1]) if tokens else b"",
        logprobs=pack_float32([0, -1, -2]) if tokens else b"",
        step=7,
        error=error,
    )
    e = Evaluation(run_id="r", trajectory_id=f"g-{i}", group_id="g", reward=reward, step=7, error=error)
    return t, e


def test_complete_group_gets_grpo_advantages():
    joined = [member(i, r) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    samples = group_outcome("r", "g", 7, 4, joined, "grpo", filter_zero_variance=True)
    # mean 0.5; sample std (n-1) = sqrt(4 * 0.25 / 3) = 0.57735; advantage = +-0.5 / 0.57735
    expected = 0.5 / math.sqrt(1 / 3)
    assert [s.advantage for s in samples] == pytest.approx([expected, -expected, -expected, expected], rel=1e-5)
    assert all(isinstance(s, Sample) and s.step == 7 and s.weight_version == 3 for s in samples)
    assert samples[0].group_reward_mean == 0.5
    assert samples[0].group_reward_std == pytest.approx(math.sqrt(1 / 3))
    assert samples[0].tokens == joined[0][0].tokens  # the exact tokens travel on


def test_rloo_and_dr_grpo_by_name():
    joined = [member(i, r) for i, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    rloo = group_outcome("r", "g", 7, 4, joined, "rloo", True)
    assert [s.advantage for s in rloo] == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    dr = group_outcome("r", "g", 7, 4, joined, "dr_grpo", True)
    assert [s.advantage for s in dr] == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_zero_variance_group_is_filtered_with_its_rewards():
    joined = [member(i, 1.0) for i in range(4)]
    outcome = group_outcome("r", "g", 7, 4, joined, "grpo", filter_zero_variance=True)
    assert isinstance(outcome, GroupFiltered)
    assert outcome.reason == "zero_variance" and outcome.rewards == [1.0] * 4 and outcome.received == 4
    kept = group_outcome("r", "g", 7, 4, joined, "grpo", filter_zero_variance=False)
    assert [s.advantage for s in kept] == [0.0] * 4


def test_failed_rollouts_take_no_part():
    joined = [member(0, 1.0), member(1, 0.0), member(2, 0.0, error="boom"), member(3, 0.0)]
    samples = group_outcome("r", "g", 7, 4, joined, "dr_grpo", True)
    assert [s.trajectory_id for s in samples] == ["g-0", "g-1", "g-3"]
    assert [s.advantage for s in samples] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    all_failed = [member(i, 0.0, error="boom") for i in range(4)]
    assert group_outcome("r", "g", 7, 4, all_failed, "grpo", True).reason == "all_failed"


def test_timeout_policy():
    partial = [member(0, 1.0), member(1, 0.0)]
    dropped = group_outcome("r", "g", 7, 4, partial, "grpo", True, timed_out=True, train_partial=False)
    assert isinstance(dropped, GroupFiltered) and dropped.reason == "timeout" and dropped.received == 2
    trained = group_outcome("r", "g", 7, 4, partial, "grpo", True, timed_out=True, train_partial=True)
    assert [s.group_size for s in trained] == [2, 2]
    assert [s.advantage for s in trained] == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)], rel=1e-5)
