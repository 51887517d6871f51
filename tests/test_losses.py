"""Loss maths against values computed by hand, and gradient accumulation exactness."""

import math

import pytest
import torch

from streamrl.algos.kl import kl_penalty
from streamrl.algos.losses import (
    aggregate_loss,
    entropy_from_logits,
    ppo_clip_token_loss,
    token_logprobs,
    truncated_importance_weights,
)


def lp(x):
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize(
    "ratio, advantage, expected_loss, clipped",
    [
        (1.5, 1.0, -1.28, 1.0),  # high side: r clipped to 1 + 0.28
        (0.9, 1.0, -0.9, 0.0),  # inside the range
        (0.5, -1.0, 0.8, 1.0),  # low side: r clipped to 1 - 0.2; -A * 0.8 = 0.8 > 0.5
        (1.5, -1.0, 1.5, 0.0),  # negative advantage above the range: unclipped is the max
        (5.0, -1.0, 3.0, 1.0),  # ... far above it: dual-clip caps -A * r = 5 at -A * 3
        (0.5, 1.0, -0.5, 0.0),  # positive advantage below the range: unclipped is the max
    ],
)
def test_ppo_clip_both_sides(ratio, advantage, expected_loss, clipped):
    loss, was_clipped = ppo_clip_token_loss(
        lp([math.log(ratio)]), lp([0.0]), lp([advantage]), clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0
    )
    assert loss.item() == pytest.approx(expected_loss, abs=1e-9)
    assert was_clipped.item() == clipped


def test_truncated_importance_weights():
    weights = truncated_importance_weights(lp([math.log(0.5), math.log(0.9)]), lp([math.log(0.25), math.log(0.9)]), cap=1.5)
    assert weights.tolist() == pytest.approx([1.5, 1.0])  # 0.5 / 0.25 = 2 capped to 1.5; 1.0


def test_aggregations():
    token_loss = lp([[1, 2, 3], [4, 5, 6]])
    mask = lp([[1, 1, 0], [1, 0, 0]])
    # masked sum = 1 + 2 + 4 = 7 over 3 tokens and 2 sequences
    assert aggregate_loss(token_loss, mask, "token-mean", 3, 2).item() == pytest.approx(7 / 3)
    # per sequence: (1 + 2) / 2 = 1.5 and 4 / 1 = 4; mean 2.75
    assert aggregate_loss(token_loss, mask, "seq-mean-token-mean", 3, 2).item() == pytest.approx(2.75)
    assert aggregate_loss(token_loss, mask, "seq-mean-token-sum", 3, 2).item() == pytest.approx(3.5)
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate_loss(token_loss, mask, "mean", 3, 2)


def test_kl_estimators():
    logp, ref = lp([math.log(0.5)]), lp([math.log(0.25)])  # log ratio = ln 2 = 0.693147
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.240227, abs=1e-6)  # ln2^2 / 2
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.193147, abs=1e-6)  # 0.5 + ln2 - 1
    assert kl_penalty(ref, ref, "k3").item() == 0.0
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(logp, ref, "k4")


def test_entropy_and_token_logprobs():
    assert entropy_from_logits(torch.zeros(1, 1, 4)).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(torch.tensor([[[0.0, -1e9]]])).item() == pytest.approx(0.0, abs=1e-6)
    # vocab of 2; logits at position 0 give p = softmax([ln 3, 0]) = [0.75, 0.25]
    logits = torch.tensor([[[math.log(3), 0.0], [0.0, 0.0]]])
    tokens = torch.tensor([[0, 1]])
    assert token_logprobs(logits, tokens).tolist()[0] == pytest.approx([0.0, math.log(0.25)])


class TinyPolicy(torch.nn.Module):
    def __init__(self, vocab=11, hidden=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)))


def batch_loss(model, tokens, mask, old, advantages, mode, global_tokens, global_sequences):
    logp = token_logprobs(model(tokens), tokens)
    token_loss, _ = ppo_clip_token_loss(logp, old, advantages.unsqueeze(-1).expand_as(logp), 0.2, 0.28)
    return aggregate_loss(token_loss, mask, mode, global_tokens, global_sequences)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_four_micro_batches_give_the_gradient_of_one_batch(mode):
    torch.manual_seed(0)
    model = TinyPolicy().double()
    tokens = torch.randint(0, 11, (8, 12))
    lengths = torch.tensor([3, 11, 5, 7, 2, 9, 11, 4])  # very different lengths per micro-batch
    mask = (torch.arange(12).unsqueeze(0) < lengths.unsqueeze(1) + 1).double()
    mask[:, 0] = 0
    old = torch.randn(8, 12, dtype=torch.float64) * 0.1 - 2.0
    advantages = torch.randn(8, dtype=torch.float64)
    global_tokens, global_sequences = mask.sum().item(), 8

    model.zero_grad()
    batch_loss(model, tokens, mask, old, advantages, mode, global_tokens, global_sequences).backward()
    full = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    for chunk in torch.arange(8).split(2):
        batch_loss(
            model, tokens[chunk], mask[chunk], old[chunk], advantages[chunk], mode, global_tokens, global_sequences
        ).backward()
    accumulated = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(full, accumulated):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)

    if mode == "token-mean":
        # The trap: normalising each micro-batch by its own token count gives another gradient.
        model.zero_grad()
        for chunk in torch.arange(8).split(2):
            (
                batch_loss(model, tokens[chunk], mask[chunk], old[chunk], advantages[chunk], mode, mask[chunk].sum().item(), 2)
                / 4
            ).backward()
        wrong = [p.grad.clone() for p in model.parameters()]
        assert max((a - b).abs().max().item() for a, b in zip(full, wrong)) > 1e-3


def test_gspo_clips_whole_sequences_by_their_geometric_mean_ratio():
    from streamrl.algos.losses import POLICY_LOSSES
    from streamrl.runtime.config import Algorithm

    config = Algorithm(clip_ratio_low=0.2, clip_ratio_high=0.28, policy_loss="gspo")
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    # sequence 1: token log-ratios ln 2 and -ln 2 -> mean 0 -> s = 1, inside the clip range
    # sequence 2: token log-ratios ln 2 and ln 2 -> mean ln 2 -> s = 2, clipped to 1.28
    logprobs = torch.tensor([[0.0, math.log(0.5), math.log(0.5)], [0.0, math.log(0.5), math.log(0.5)]], requires_grad=True)
    behaviour = torch.tensor([[0.0, math.log(0.25), math.log(1.0)], [0.0, math.log(0.25), math.log(0.25)]])
    advantages = torch.tensor([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]])
    out = POLICY_LOSSES.get("gspo")(logprobs, behaviour, advantages, mask, config)
    # -A * s = -2 on sequence 1; max(-1 * 2, -1 * 1.28) = -1.28 on sequence 2, clipped
    assert (out.token_loss * mask).flatten().tolist() == pytest.approx([0.0, -2.0, -2.0, 0.0, -1.28, -1.28])
    assert (out.clipped * mask).tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    (out.token_loss * mask).sum().backward()
    # unclipped: d(-A * s_it)/d logp_t = -A * s = -2 per trained token; clipped: no gradient
    assert logprobs.grad.flatten().tolist() == pytest.approx([0.0, -2.0, -2.0, 0.0, 0.0, 0.0])


def test_logprobs_and_entropy_from_one_log_softmax_match_the_two_functions():
    from streamrl.algos.losses import token_logprobs_and_entropy

    torch.manual_seed(0)
    logits, tokens = torch.randn(2, 7, 11), torch.randint(0, 11, (2, 7))
    logprobs, entropy = token_logprobs_and_entropy(logits, tokens, temperature=0.7, chunk=3)
    assert torch.allclose(logprobs, token_logprobs(logits / 0.7, tokens), atol=1e-6)
    assert torch.allclose(entropy, entropy_from_logits(logits / 0.7), atol=1e-5)
