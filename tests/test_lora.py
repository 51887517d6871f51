"""trainer.lora: the self-hosted learner trains a LoRA adapter (peft) instead of every
weight. Only the adapter changes; weight versions are the base model with the adapter
merged; the KL reference is the base model (the same module, the adapter off); two
processes (FSDP2 on gloo) train to what one does."""

from __future__ import annotations

import itertools
import math
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from streamrl.learner.batching import TrainItem
from streamrl.learner.policy import Policy
from streamrl.learner.snapshots import bytes_on_disk
from streamrl.learner.trainers import GRPOTrainer
from streamrl.runtime.config import Recipe
from streamrl.runtime.lora import LoraSpec, merged_state_dict, with_lora
from streamrl.runtime.tiny_lm import build_tiny_model, load
from tests.test_learner_parallel import run_ranks


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model"), seed=11)


def batch(count: int = 6) -> list[TrainItem]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        n = int(rng.integers(6, 12))
        mask = np.array([0] * 2 + [1] * (n - 2), dtype=np.uint8)
        out.append(
            TrainItem(
                tokens=rng.integers(4, 60, n).astype(np.int32),
                mask=mask,
                behaviour_logprobs=(np.log(rng.uniform(0.2, 0.9, n)) * mask).astype(np.float32),
                advantage=1.0 if i % 2 else -1.0,
                trajectory_id=str(i),
                group_id="g",
            )
        )
    return out


def sequence_logprobs(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]


def test_merging_equals_peft_merge_and_unload(tiny):
    """W + (alpha / r) * B @ A on the state dict (what the learner writes, sharded or not)
    is peft's own merge, for every parameter; lm_head as a target unties it first."""
    for targets in (("q_proj", "v_proj", "down_proj"), ("q_proj", "lm_head")):
        spec = LoraSpec(rank=4, alpha=12.0, dropout=0.0, target_modules=targets)
        model = with_lora(load(tiny)[1], spec)
        torch.manual_seed(0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # a fresh adapter is zero: give it something to merge
                parameter.data.normal_(0, 0.1)
        ours = merged_state_dict(model.state_dict(), spec.scale)
        theirs = model.merge_and_unload().state_dict()
        assert ours.keys() == theirs.keys()
        assert all(torch.allclose(ours[k], theirs[k], atol=1e-6) for k in ours)


def test_the_learner_trains_only_the_adapter_and_writes_merged_versions(tiny, tmp_path):
    recipe = Recipe.from_dict(
        {
            "rollout_worker": {"model_path": str(tiny)},
            "algorithm": {"use_kl_loss": True, "kl_loss_coef": 0.1},
            "trainer": {"lr": 1e-2, "micro_batch_tokens": 64, "device": "cpu", "lora": {"rank": 4, "alpha": 8.0}},
        }
    )
    policy = Policy(recipe, GRPOTrainer, tmp_path / "checkpoints")
    trainable = {name for name, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    frozen_before = {name: p.detach().clone() for name, p in policy.model.named_parameters() if not p.requires_grad}
    losses = [policy.train(1e-2, batch()).loss for _ in range(4)]
    # the same batch four times: its surrogate loss falls at every step (observed 0.468 -> 0.460)
    assert all(math.isfinite(loss) for loss in losses) and all(a > b for a, b in itertools.pairwise(losses)), losses
    for name, p in policy.model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen_before[name]), name  # the base stays as loaded
    # the weight version: a plain model folder, the adapter merged, scoring as the policy does
    folder = policy.write_version(tmp_path / "weights", 4)
    merged = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert not any("lora" in name for name in merged.state_dict())
    tokens = [5, 9, 13, 21, 8, 40, 3]
    policy.model.eval()
    assert torch.allclose(sequence_logprobs(merged, tokens), sequence_logprobs(policy.model, tokens), atol=1e-5)
    # the KL reference is the base model: the adapter off, no second copy
    base = load(tiny)[1].eval()
    assert torch.allclose(sequence_logprobs(policy.ref_model, tokens), sequence_logprobs(base, tokens), atol=1e-6)
    assert not torch.allclose(sequence_logprobs(merged, tokens), sequence_logprobs(base, tokens), atol=1e-3)


def test_two_processes_train_a_lora_to_what_one_does(tiny, tmp_path):
    """FSDP2 over the peft model (its blocks sharded) on gloo: the merged weight versions of
    1 and 2 processes after a warm-up and three GRPO steps agree to 1e-5, and only the
    adapted layers moved."""
    for n in (1, 2):
        run_ranks(n, tiny, tmp_path / f"ranks{n}", "train", STREAMRL_TEST_LORA="4")
    # the snapshot keeps what trains (the adapter and its AdamW state), not the frozen base,
    # and a snapshot of two processes resumes on one to the same weights
    shards = tmp_path / "ranks2" / "checkpoints" / "step-000003" / "shards"
    assert bytes_on_disk(shards) < bytes_on_disk(tiny) / 2, (bytes_on_disk(shards), bytes_on_disk(tiny))
    shutil.copytree(tmp_path / "ranks2" / "checkpoints", tmp_path / "ranks2to1" / "checkpoints")
    run_ranks(2, tiny, tmp_path / "ranks2", "resume", STREAMRL_TEST_LORA="4")
    run_ranks(1, tiny, tmp_path / "ranks2to1", "resume", STREAMRL_TEST_LORA="4")
    two, two_to_one = (torch.load(tmp_path / name / "params-resume.pt") for name in ("ranks2", "ranks2to1"))
    assert all(torch.allclose(two[k], two_to_one[k], atol=1e-6, rtol=0) for k in two)
    one, two = (torch.load(tmp_path / f"ranks{n}" / "params-train.pt") for n in (1, 2))
    start = load(tiny)[1].state_dict()
    assert one.keys() == two.keys() == start.keys()
    for name in one:
        assert torch.allclose(one[name], two[name], atol=1e-5, rtol=0), name
        adapted = name.endswith(".weight") and any(
            f".{target}." in name for target in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        )
        assert torch.equal(one[name], start[name]) != adapted, name  # only the adapted weights moved


def test_lora_with_gradient_checkpointing_and_bf16_writes_adapter_versions(tiny, tmp_path):
    """trainer.lora with gradient checkpointing and bf16 compute: the adapter gets gradients
    through the recomputed blocks (the loss falls at every step); with versions: adapter a
    version is the peft folder alone, which peft loads onto the base model to score as the
    policy does."""
    from peft import PeftModel

    recipe = Recipe.from_dict(
        {
            "rollout_worker": {"model_path": str(tiny)},
            "trainer": {
                "lr": 1e-2,
                "micro_batch_tokens": 64,
                "device": "cpu",
                "gradient_checkpointing": True,
                "dtype": "bfloat16",
                "lora": {"rank": 4, "alpha": 8.0, "versions": "adapter"},
            },
        }
    )
    policy = Policy(recipe, GRPOTrainer, tmp_path / "checkpoints")
    losses = [policy.train(1e-2, batch()).loss for _ in range(4)]
    assert all(math.isfinite(loss) for loss in losses) and all(a > b for a, b in itertools.pairwise(losses)), losses
    folder = policy.write_version(tmp_path / "weights", 4)
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    served = PeftModel.from_pretrained(load(tiny)[1], folder).eval()
    tokens = [5, 9, 13, 21, 8, 40, 3]
    policy.model.eval()
    assert torch.allclose(sequence_logprobs(served, tokens), sequence_logprobs(policy.model, tokens), atol=1e-5)
    assert not torch.allclose(sequence_logprobs(served, tokens), sequence_logprobs(load(tiny)[1].eval(), tokens), atol=1e-3)
    # written in the background (start_version), the same bytes
    policy.start_version(tmp_path / "background", 4)
    ((_, background),) = policy.written_versions(wait=True)
    assert (background / "adapter_model.safetensors").read_bytes() == (folder / "adapter_model.safetensors").read_bytes()
