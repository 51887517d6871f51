"""The shared-prefix forward (learner/shared_prefix.py) against the plain forward: the
same logprobs, loss, gradient and step; the cases where it cannot run are refused or
left off with a reason."""

import logging
import re

import numpy as np
import pytest
import torch

from streamrl.learner.batching import TrainItem, collate
from streamrl.learner.shared_prefix import plan_prefixes
from streamrl.learner.trainers import GRPOTrainer
from streamrl.runtime.config import Algorithm as AlgorithmConfig
from streamrl.runtime.config import KlControl, Recipe
from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.inert_keys import inert_key_problems
from streamrl.runtime.tiny_lm import build_tiny_model, load


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model"), seed=5)


def groups(seed: int = 0) -> list[TrainItem]:
    """Three prompts of different lengths, four rollouts each with answers of different
    lengths; one rollout of the last group is multi-turn (an untrained tool output in
    the middle of its answer)."""
    rng = np.random.default_rng(seed)
    out = []
    for group, prompt_length in enumerate((3, 7, 5)):
        prompt = rng.integers(4, 60, prompt_length)
        for sample in range(4):
            answer_length = int(rng.integers(2, 9))
            tokens = np.concatenate([prompt, rng.integers(4, 60, answer_length)]).astype(np.int32)
            mask = np.array([0] * prompt_length + [1] * answer_length, dtype=np.uint8)
            if group == 2 and sample == 0 and answer_length > 4:
                mask[prompt_length + 2 : prompt_length + 4] = 0  # a tool's output: kept, not trained
            out.append(
                TrainItem(
                    tokens=tokens,
                    mask=mask,
                    behaviour_logprobs=(np.log(rng.uniform(0.2, 0.9, len(tokens))) * mask).astype(np.float32),
                    advantage=float(rng.normal()),
                    trajectory_id=f"{group}-{sample}",
                    group_id=str(group),
                )
            )
    return out


def trainer(model_dir, shared_prefix: str, lr: float = 0.0):
    tokenizer, model = load(model_dir)
    return GRPOTrainer(
        model,
        tokenizer.pad_token_id,
        TrainerConfig(lr=lr, micro_batch_tokens=4096, shared_prefix=shared_prefix),
        AlgorithmConfig(loss_agg_mode="token-mean"),
    )


def test_the_plan_runs_each_distinct_prompt_once_and_keeps_every_rows_own_tokens():
    batch = collate(groups(), pad_id=0)
    plan = plan_prefixes(batch, batch.loss_mask, pad_id=0)
    assert plan.prefix_ids.shape[0] == 3  # 12 rows, 3 prompts
    assert plan.row_prefix.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert plan.prefix_lengths.tolist() == [3] * 4 + [7] * 4 + [5] * 4
    for row, item in enumerate(groups()):
        own = plan.suffix_ids[row, : int(plan.suffix_mask[row].sum())].tolist()
        assert own == item.tokens[plan.prefix_lengths[row] :].tolist()
    # no two rows alike: nothing to share, the plain forward runs
    lone = collate([groups()[0], groups()[4]], pad_id=0)
    assert plan_prefixes(lone, lone.loss_mask, pad_id=0) is None


def test_logprobs_and_entropy_equal_the_plain_forwards_on_every_trained_token(tiny):
    shared, plain = trainer(tiny, "on"), trainer(tiny, "off")
    batch = collate(groups(), shared.pad_id)
    with torch.no_grad():
        ours, our_entropy = shared.logprobs(shared.model, batch)
        theirs, their_entropy = plain.logprobs(plain.model, batch)
    trains = batch.loss_mask > 0
    assert shared.shared_prefix and trains.sum() > 40
    assert torch.allclose(ours[trains], theirs[trains], atol=1e-5)
    assert torch.allclose(our_entropy[trains], their_entropy[trains], atol=1e-5)


def test_a_step_gives_the_plain_steps_loss_and_gradient(tiny):
    # gradients, not the weights after Adam: Adam turns float noise in a near-zero
    # gradient into a step of up to lr
    grads, results = {}, {}
    for setting in ("on", "off"):
        t = trainer(tiny, setting, lr=1e-2)
        step = t.optimizer.step
        t.optimizer.step = lambda setting=setting, t=t, step=step: (
            grads.__setitem__(setting, {n: p.grad.clone() for n, p in t.model.named_parameters()}),
            step(),
        )
        results[setting] = t.step(groups())
    assert results["on"].loss == pytest.approx(results["off"].loss, abs=1e-6)
    assert results["on"].grad_norm == pytest.approx(results["off"].grad_norm, rel=1e-5)
    for name, grad in grads["off"].items():
        assert torch.allclose(grads["on"][name], grad, atol=1e-6), name  # the prompt's gradient summed over rows
    assert results["on"].metrics["ratio"] == pytest.approx(results["off"].metrics["ratio"], abs=1e-6)


class NoCacheModel(torch.nn.Module):
    """A causal LM whose forward keeps no cache: the shared prefix cannot run on it."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, past_key_values=None, use_cache=False, **kwargs):
        if past_key_values is not None:
            raise TypeError("this model takes no past_key_values")
        kwargs.pop("logits_to_keep", None)
        kwargs.pop("cache_position", None)
        return self.inner(use_cache=False, **kwargs)


def test_a_model_it_cannot_run_on_trains_plainly_under_auto_and_stops_under_on(tiny, caplog):
    tokenizer, model = load(tiny)
    config = TrainerConfig(lr=1e-2, micro_batch_tokens=4096, shared_prefix="auto")
    auto = GRPOTrainer(NoCacheModel(model), tokenizer.pad_token_id, config, AlgorithmConfig())
    with caplog.at_level(logging.WARNING):
        result = auto.step(groups())
    assert result.skipped is None and not auto.shared_prefix
    assert "trainer.shared_prefix: auto" in caplog.text and "training with the plain forward" in caplog.text
    strict = GRPOTrainer(
        NoCacheModel(load(tiny)[1]),
        tokenizer.pad_token_id,
        TrainerConfig(lr=1e-2, micro_batch_tokens=4096, shared_prefix="on"),
        AlgorithmConfig(),
    )
    with pytest.raises(RuntimeError, match=re.escape("trainer.shared_prefix: on, but the model's forward failed")):
        strict.step(groups())


def test_on_where_it_cannot_run_is_refused_naming_the_key(tiny):
    recipe = Recipe()
    recipe.trainer.shared_prefix = "on"
    recipe.trainer.gradient_checkpointing = True
    assert any(p.startswith("trainer.shared_prefix: 'on' does nothing here") for p in inert_key_problems(recipe))
    tokenizer, model = load(tiny)
    with pytest.raises(ValueError, match=re.escape("trainer.shared_prefix: on does not run with packed rows")):
        GRPOTrainer(model, tokenizer.pad_token_id, TrainerConfig(shared_prefix="on", packing="packed"), AlgorithmConfig())
    auto = GRPOTrainer(model, tokenizer.pad_token_id, TrainerConfig(packing="packed"), AlgorithmConfig())
    assert not auto.shared_prefix  # auto: packed rows already run each token once


def test_the_kl_reference_runs_the_shared_prefix_too_and_gives_the_same_kl(tiny):
    results = {}
    for setting in ("on", "off"):
        tokenizer, model = load(tiny)
        reference = load(tiny)[1].eval()
        with torch.no_grad():  # a reference that differs from the policy: the KL is not 0
            for parameter in reference.parameters():
                parameter.mul_(0.9)
        t = GRPOTrainer(
            model,
            tokenizer.pad_token_id,
            TrainerConfig(lr=0.0, micro_batch_tokens=4096, shared_prefix=setting),
            AlgorithmConfig(loss_agg_mode="token-mean", use_kl_loss=True, kl_ctrl=KlControl(kl_coef=0.1)),
            ref_model=reference,
        )
        results[setting] = t.step(groups())
    assert results["on"].metrics["kl"] > 1e-3
    assert results["on"].metrics["kl"] == pytest.approx(results["off"].metrics["kl"], rel=1e-5)
    assert results["on"].loss == pytest.approx(results["off"].loss, abs=1e-6)
