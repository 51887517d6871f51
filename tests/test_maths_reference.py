"""The maths where StreamRL once differed from verl and TRL, and what peers have that it
lacked, against values worked out by hand (the arithmetic is in the comments)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from streamrl.algos.advantages import (
    advantage_scope,
    advantages_by_group,
    get_advantage_estimator,
    grpo_advantages,
    returns_to_go,
    turn_advantages,
)
from streamrl.algos.kl import kl_penalty
from streamrl.algos.losses import POLICY_LOSSES, aggregate_loss, ppo_clip_token_loss
from streamrl.consumers.processor import group_outcome
from streamrl.learner.batching import TrainItem
from streamrl.learner.step_inputs import with_batch_advantages
from streamrl.schema.events import Evaluation, Trajectory, Turn, pack_float32, pack_int32, pack_mask, unpack_float32

CLIP = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
E10 = 22026.465794806718  # e^10


def t(values, grad=False):
    return torch.tensor(values, dtype=torch.float32, requires_grad=grad)


# --- bug 1: GSPO on a stale sequence with a negative advantage -------------------------------


def test_gspo_with_negative_advantage_and_sequence_log_ratio_15_is_bounded_with_no_gradient():
    # two trained tokens, log pi - log pi_behaviour = 15 each: s = 15, past the cap of 10.
    # ratio = e^10 on every token; A = -1: unclipped -A * e^10 = 22026.47 beats the clipped
    # -A * 1.28, so the loss is e^10 per token, token-mean e^10, and no gradient flows.
    logprobs = t([[-1.0, -2.0]], grad=True)
    behaviour, mask, advantages = t([[-16.0, -17.0]]), t([[1.0, 1.0]]), t([[-1.0, -1.0]])
    policy = POLICY_LOSSES.get("gspo")(logprobs, behaviour, advantages, mask, CLIP)
    loss = aggregate_loss(policy.token_loss, mask, "token-mean", 2, 1)
    loss.backward()
    assert loss.item() == pytest.approx(E10, rel=1e-6)
    assert logprobs.grad.tolist() == [[0.0, 0.0]]
    # before: the detached ratio was clamped at e^20 with the token gradient kept, 4.85e8 per token
    assert loss.item() < 1e5


def test_gspo_below_the_cap_keeps_its_gradient():
    # s = 1 on one token, A = -1: ratio e, unclipped -A * e = 2.718 beats clipped 1.28;
    # d loss / d logprob = -A * e = e
    logprobs = t([[-1.0]], grad=True)
    policy = POLICY_LOSSES.get("gspo")(logprobs, t([[-2.0]]), t([[-1.0]]), t([[1.0]]), CLIP)
    policy.token_loss.sum().backward()
    assert policy.token_loss.item() == pytest.approx(math.e, rel=1e-6)
    assert logprobs.grad.item() == pytest.approx(math.e, rel=1e-6)


# --- bug 2: k3 unclamped, and masks that multiply ---------------------------------------------


@pytest.mark.parametrize(
    "log_ratio, expected",
    [
        (-50.0, 10.0),  # clamped to -20: e^20 - 20 - 1 = 4.85e8, clamped to 10
        (50.0, 10.0),  # clamped to 20: e^-20 + 20 - 1 = 19.0, clamped to 10
        (-1.0, math.e - 2.0),  # e^1 - 1 - 1 = 0.718282, inside both clamps
        (1.0, math.exp(-1.0)),  # e^-1 + 1 - 1 = 0.367879
    ],
)
def test_k3_at_extreme_log_ratios_matches_verls_low_variance_kl(log_ratio, expected):
    logprobs = t([log_ratio], grad=True)
    value = kl_penalty(logprobs, t([0.0]), "k3")
    value.backward()
    assert value.item() == pytest.approx(expected, rel=1e-6)
    if abs(log_ratio) == 50.0:
        assert logprobs.grad.item() == 0.0  # past the clamps: no gradient


def test_k3_plus_has_k3s_value_and_k2s_gradient_and_abs_is_the_absolute_log_ratio():
    logprobs = t([0.5], grad=True)
    value = kl_penalty(logprobs, t([0.0]), "k3+")
    value.backward()
    assert value.item() == pytest.approx(math.exp(-0.5) + 0.5 - 1.0, rel=1e-6)  # 0.106531
    assert logprobs.grad.item() == pytest.approx(0.5)  # d(x^2 / 2)/dx = x, where k3's is 1 - e^-0.5 = 0.393
    logprobs = t([-2.0], grad=True)
    value = kl_penalty(logprobs, t([0.0]), "abs")
    value.backward()
    assert value.item() == 2.0 and logprobs.grad.item() == -1.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("kl_estimator", ["k1", "k2", "k3", "k3+", "abs"])
def test_padding_with_minus_inf_logprobs_changes_nothing(mode, kl_estimator):
    # two sequences; the second is one token shorter, and its padding holds -inf behaviour
    # and reference logprobs (as a sampler that reports -inf for impossible tokens would).
    logprobs = t([[-0.5, -1.0], [-0.7, -0.2]], grad=True)
    behaviour = t([[-0.6, -1.2], [-0.9, -math.inf]])
    ref = t([[-0.4, -1.1], [-0.8, -math.inf]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    advantages = t([[1.0, 1.0], [-1.0, -1.0]])

    def loss_of(lp, beh, rf, m, adv):
        token_loss, _ = ppo_clip_token_loss(lp, beh, adv, 0.2, 0.28, 3.0)
        token_loss = token_loss + 0.1 * kl_penalty(lp, rf, kl_estimator)
        return aggregate_loss(token_loss, m, mode, float(m.sum()), 2.0)

    padded = loss_of(logprobs, behaviour, ref, mask, advantages)
    padded.backward()
    assert math.isfinite(padded.item()) and torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[1, 1].item() == 0.0
    # the three real tokens alone, aggregated by hand
    flat, _ = ppo_clip_token_loss(t([-0.5, -1.0, -0.7]), t([-0.6, -1.2, -0.9]), t([1.0, 1.0, -1.0]), 0.2, 0.28, 3.0)
    l0, l1, l2 = (flat + 0.1 * kl_penalty(t([-0.5, -1.0, -0.7]), t([-0.4, -1.1, -0.8]), kl_estimator)).tolist()
    expected = {
        "token-mean": (l0 + l1 + l2) / 3,
        "seq-mean-token-sum": (l0 + l1 + l2) / 2,
        "seq-mean-token-mean": ((l0 + l1) / 2 + l2) / 2,
    }[mode]
    assert padded.item() == pytest.approx(expected, rel=1e-5)  # float32 sums in another order


# --- numerics: k3+'s value, k2's gradient at a masked -inf, sums of bfloat16 losses ----------


@pytest.mark.parametrize("estimator", ["k2", "k3+"])
def test_a_masked_minus_inf_reference_gives_no_nan_gradient(estimator):
    # log-ratios -1 - (-1.5) = 0.5 (trained) and -2 - (-inf) = inf (masked): k2's token
    # losses 0.125 and inf; token-mean over the one trained token 0.125, gradient x = 0.5
    logprobs = t([[-1.0, -2.0]], grad=True)
    loss = aggregate_loss(kl_penalty(logprobs, t([[-1.5, -math.inf]]), estimator), t([[1.0, 0.0]]), "token-mean", 1.0, 1.0)
    loss.backward()
    expected = 0.125 if estimator == "k2" else math.exp(-0.5) + 0.5 - 1.0  # k3+'s value is k3's: 0.106531
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert logprobs.grad.tolist() == [[0.5, 0.0]]  # before: [[0.5, nan]]


def test_k3_plus_keeps_k3s_value_exactly_at_large_log_ratios():
    # k3 at log-ratio -22.5 is clamped to 10; (k3 + k2) - k2 rounded it to 11 in bfloat16
    bf16 = torch.tensor([-22.5], dtype=torch.bfloat16)
    assert kl_penalty(bf16, torch.zeros(1, dtype=torch.bfloat16), "k3+").item() == 10.0
    for log_ratio in (50.0, -50.0, 19.0, -19.0):  # +-50 past both clamps; +-19 inside the log-ratio clamp
        plus = kl_penalty(t([log_ratio]), t([0.0]), "k3+").item()
        assert plus == pytest.approx(kl_penalty(t([log_ratio]), t([0.0]), "k3").item(), abs=1e-6)


def test_bfloat16_token_losses_sum_in_float32():
    # 4,096 bfloat16 losses: the float32 sum equals the float64 sum of the same values to
    # float32 precision; a bfloat16 running sum keeps 8 bits (it was off by up to 2.6e-3)
    generator = torch.Generator().manual_seed(0)
    token_loss = torch.rand(4, 1024, generator=generator).to(torch.bfloat16)
    mask = torch.ones(4, 1024)
    loss = aggregate_loss(token_loss, mask, "token-mean", 4096.0, 4.0)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(token_loss.double().sum().item() / 4096, rel=1e-6)


def test_gspo_follows_a_low_sequence_ratio_below_e_to_the_minus_20():
    # s = -30 (two tokens at -30), A = +1: ratio e^-30; unclipped -e^-30 beats clipped -0.8,
    # so the loss is -e^-30 = -9.36e-14 a token (verl's), not -e^-20 = -2.06e-9 (a clamp at -20)
    logprobs = t([[-31.0, -32.0]], grad=True)
    policy = POLICY_LOSSES.get("gspo")(logprobs, t([[-1.0, -2.0]]), t([[1.0, 1.0]]), t([[1.0, 1.0]]), CLIP)
    assert policy.token_loss.tolist()[0] == pytest.approx([-math.exp(-30.0)] * 2, rel=1e-5)


# --- new aggregations and the std epsilon -------------------------------------------------------


def test_token_sum_and_dr_grpos_constant_normaliser_by_hand():
    token_loss = t([[1, 2, 3], [4, 5, 6]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    # masked sum 1 + 2 + 4 = 7
    assert aggregate_loss(token_loss, mask, "token-sum", 3, 2).item() == pytest.approx(7.0)
    # 7 / (2 sequences x a budget of 4 tokens) = 0.875, whatever the sequences' own lengths
    assert aggregate_loss(token_loss, mask, "seq-mean-token-sum-norm", 3, 2, 4.0).item() == pytest.approx(0.875)


def test_trls_std_epsilon_beside_verls():
    # [1, 0]: mean 0.5, sample std sqrt(0.5) = 0.707107
    assert grpo_advantages([1.0, 0.0]).tolist() == pytest.approx([0.707106, -0.707106], rel=1e-5)  # 0.5 / 0.707108
    assert grpo_advantages([1.0, 0.0], 1e-4).tolist() == pytest.approx([0.707007, -0.707007], rel=1e-5)


# --- REINFORCE++ over a step of three groups ----------------------------------------------------

GROUP_IDS = ["a", "a", "b", "c", "c", "c"]
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
TOKENS = [2.0, 4.0, 3.0, 1.0, 1.0, 2.0]  # 13 trained tokens in all


def test_reinforce_plus_plus_whitens_over_the_steps_tokens():
    # token-weighted mean: (1*2 + 1*3 + 1*2) / 13 = 7/13; reward-1 rows hold 7 tokens, reward-0
    # rows 6; var = (7 (6/13)^2 + 6 (7/13)^2) / 12 = (546/169) / 12 = 7/26 = 0.269231
    # A(1) = (6/13) / sqrt(7/26) = 0.889499, A(0) = -(7/13) / sqrt(7/26) = -1.037749
    assert advantage_scope("reinforce_plus_plus") == "batch" and advantage_scope("grpo") == "group"
    values = advantages_by_group(GROUP_IDS, REWARDS, TOKENS, "reinforce_plus_plus")
    high, low = 0.889499, -1.037749
    assert values.tolist() == pytest.approx([high, low, high, low, low, high], rel=1e-5)


def test_reinforce_plus_plus_baseline_centres_by_group_then_whitens():
    # centred by group: a [0.5, -0.5]; b alone keeps its reward [1]; c [-1/3, -1/3, 2/3]
    # token-weighted mean (2*0.5 - 4*0.5 + 3*1 - 1/3 - 1/3 + 2*2/3) / 13 = (8/3) / 13 = 8/39
    # var = (sum n c^2 - 13 (8/39)^2) / 12 = (4.5 + 10/9 - 64/117) / 12 = 395/936 = 0.422009
    values = advantages_by_group(GROUP_IDS, REWARDS, TOKENS, "reinforce_plus_plus_baseline")
    sd = math.sqrt(395 / 936)
    expected = [(c - 8 / 39) / sd for c in [0.5, -0.5, 1.0, -1 / 3, -1 / 3, 2 / 3]]
    assert values.tolist() == pytest.approx(expected, rel=1e-5)
    assert expected[0] == pytest.approx(0.453913, rel=1e-5)


def test_the_learner_sets_batch_scope_advantages_on_the_samples_it_trains():
    items = [
        TrainItem(
            tokens=np.arange(n + 1, dtype=np.int32),
            mask=np.array([0] + [1] * int(n), np.uint8),
            behaviour_logprobs=np.zeros(int(n) + 1, np.float32),
            reward=r,
            group_id=g,
            trajectory_id=f"t{i}",
            token_advantages=np.ones(int(n) + 1, np.float32),
        )
        for i, (g, r, n) in enumerate(zip(GROUP_IDS, REWARDS, TOKENS))
    ]
    metrics = {}
    algorithm = SimpleNamespace(type="reinforce_plus_plus")
    trained = with_batch_advantages(items, algorithm, metrics)
    high, low = 0.889499, -1.037749
    assert trained == pytest.approx([high, low, high, low, low, high], rel=1e-5)
    assert [i.advantage for i in items] == trained and all(i.token_advantages is None for i in items)
    assert with_batch_advantages(items, SimpleNamespace(type="grpo"), {}) == []  # the samples carry theirs
    with pytest.raises(TypeError):  # a batch estimator is not a group one: it takes the step's groups
        get_advantage_estimator("reinforce_plus_plus")(np.array([1.0, 0.0]))


def test_a_batch_scope_estimators_samples_leave_the_processor_with_advantage_zero():
    joined = [episode(i, r) for i, r in enumerate([1.0, 0.0])]
    samples = group_outcome("r", "g", 1, 2, joined, "reinforce_plus_plus", True)
    assert [s.advantage for s in samples] == [0.0, 0.0] and samples[0].estimator == "reinforce_plus_plus"


# --- turn-level credit ---------------------------------------------------------------------


def episode(i, evaluator_reward, turn_rewards=(None, None)):
    """prompt [0, 2), assistant [2, 4), user [4, 5), assistant [5, 7): 7 tokens; the
    episode's reward is the evaluator's plus the turns' rewards, as the agent worker sums it."""
    turns = [
        Turn(role="prompt", start=0, end=2),
        Turn(role="assistant", start=2, end=4, trained=True, reward=turn_rewards[0]),
        Turn(role="user", start=4, end=5),
        Turn(role="assistant", start=5, end=7, trained=True, reward=turn_rewards[1]),
    ]
    total = evaluator_reward + sum(r or 0.0 for r in turn_rewards)
    traj = Trajectory(
        run_id="r",
        trajectory_id=f"g-{i}",
        task_id=f"g-{i}",
        group_id="g",
        group_size=2,
        tokens=pack_int32(range(7)),
        loss_mask=pack_mask([0, 0, 1, 1, 0, 1, 1]),
        logprobs=pack_float32([0.0] * 7),
        turns=turns,
        step=1,
    )
    return traj, Evaluation(run_id="r", trajectory_id=f"g-{i}", group_id="g", reward=total, step=1)


def test_returns_to_go():
    assert returns_to_go([0.5, 0.0, 1.0]).tolist() == [1.5, 1.0, 1.0]


def test_turn_credit_gives_each_assistant_turn_the_advantage_of_its_return():
    # episode 0: turn rewards 0.5 (first turn, from the interaction), 0 + evaluator 1.0 on
    # the last: returns G = [1.5, 1.0]; episode 1: nothing, G = [0, 0].
    # dr_grpo: baseline = mean of episode returns = 0.75, scale 1:
    # episode 0: [0.75, 0.25]; episode 1: [-0.75, -0.75]
    joined = [episode(0, 1.0, (0.5, None)), episode(1, 0.0)]
    samples = group_outcome("r", "g", 1, 2, joined, "dr_grpo", True, credit_assignment="turn")
    assert [s.advantage for s in samples] == pytest.approx([0.75, -0.75])  # the first turn's: the episode's
    assert unpack_float32(samples[0].token_advantages).tolist() == pytest.approx([0, 0, 0.75, 0.75, 0, 0.25, 0.25])
    assert unpack_float32(samples[1].token_advantages).tolist() == pytest.approx([0, 0, -0.75, -0.75, 0, -0.75, -0.75])
    # grpo: the same over the std of [1.5, 0] = 1.06066: [0.707106, 0.235702] and [-0.707106] x 2
    grpo = group_outcome("r", "g", 1, 2, joined, "grpo", True, credit_assignment="turn")
    assert unpack_float32(grpo[0].token_advantages)[[2, 5]].tolist() == pytest.approx([0.707106, 0.235702], rel=1e-5)
    # the default, episode credit: one advantage for every token (dr_grpo: +-0.75)
    episode_credit = group_outcome("r", "g", 1, 2, joined, "dr_grpo", True)
    assert [s.advantage for s in episode_credit] == pytest.approx([0.75, -0.75])
    assert episode_credit[0].token_advantages == b""


def test_turn_credit_refuses_an_estimator_without_a_baseline_form():
    with pytest.raises(ValueError, match="turn-level credit needs an estimator"):
        turn_advantages([[1.0], [0.0]], "reinforce_plus_plus")
