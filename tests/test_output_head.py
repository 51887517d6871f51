"""The output layer a chunk of positions at a time (algos/losses.py,
learner/output_head.py): the same log-probabilities and entropies as the full [B, T, V]
logits, from the pure function and through the trainer, and a step that trains the same
way; and where chunking would not be what the model computes, it is not used."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from streamrl.algos.losses import chunked_token_logprobs_and_entropy, token_logprobs_and_entropy
from streamrl.learner.batching import TrainItem
from streamrl.learner.output_head import chunkable_head
from streamrl.learner.trainers import GRPOTrainer
from streamrl.runtime.config import Algorithm as AlgorithmConfig
from streamrl.runtime.config import Trainer as TrainerConfig

VOCAB = 151_936  # Qwen2's


def test_chunks_give_the_full_logprobs_and_entropy_and_their_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(3, 37, 64, requires_grad=True)
    weight = (torch.randn(VOCAB, 64) * 0.02).requires_grad_()
    tokens = torch.randint(0, VOCAB, (3, 37))
    full_logprobs, full_entropy = token_logprobs_and_entropy(torch.nn.functional.linear(hidden, weight), tokens, 0.7)
    full_grads = torch.autograd.grad(full_logprobs.sum(), (hidden, weight))
    logprobs, entropy = chunked_token_logprobs_and_entropy(hidden, weight, None, tokens, 0.7, chunk=16)
    grads = torch.autograd.grad(logprobs.sum(), (hidden, weight))
    torch.testing.assert_close(logprobs, full_logprobs, rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, full_entropy, rtol=0, atol=1e-6)
    # the head's gradient sums over positions chunk by chunk: float32 rounding of another order
    torch.testing.assert_close(grads[0], full_grads[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(grads[1], full_grads[1], rtol=0, atol=1e-5)


def tiny_qwen2(tie: bool):
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=2048,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    return AutoModelForCausalLM.from_config(config)


def items(seed: int = 0) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 2048, 20).tolist()
    out = []
    for index in range(4):
        response = rng.integers(0, 2048, 12 + index).tolist()
        tokens = np.array(prompt + response, np.int32)
        mask = np.array([0] * len(prompt) + [1] * len(response), np.uint8)
        out.append(
            TrainItem(
                tokens=tokens,
                mask=mask,
                behaviour_logprobs=np.full(len(tokens), -7.6, np.float32),
                advantage=float(index - 1.5),
                group_id="g",
                trajectory_id=str(index),
            )
        )
    return out


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("shared_prefix", ["off", "on"])
def test_a_training_step_with_the_head_in_chunks_has_the_full_steps_loss_and_gradient(tie, shared_prefix):
    config = TrainerConfig(lr=1e-3, micro_batch_tokens=4096, shared_prefix=shared_prefix, packing="padded")
    results = []
    for chunked in (False, True):
        model = tiny_qwen2(tie)
        trainer = GRPOTrainer(model, 0, config, AlgorithmConfig())
        trainer.chunk_output = chunked
        result = trainer.step(items())
        results.append((result.loss, result.grad_norm, [p.grad.clone() for p in model.parameters()]))
    (loss, norm, grads), (chunk_loss, chunk_norm, chunk_grads) = results
    assert chunk_loss == pytest.approx(loss, abs=1e-6) and chunk_norm == pytest.approx(norm, rel=1e-5)
    # the gradients, not the parameters after the step: Adam divides a near-zero gradient by
    # its own size, which turns a float32 rounding difference into a step of up to lr
    for full, chunked in zip(grads, chunk_grads):
        torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-7)


def test_chunking_is_left_out_where_it_would_not_be_the_models_own_computation():
    model = tiny_qwen2(tie=False)
    assert chunkable_head(model, sharded=False) is model.lm_head
    assert chunkable_head(model, sharded=True) is None  # an FSDP2 root owns the head's shards
    capped = copy.deepcopy(model)
    capped.config.final_logit_softcapping = 30.0  # Gemma 2: logits transformed after the head
    assert chunkable_head(capped, sharded=False) is None
    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(tiny_qwen2(tie=False), LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    assert chunkable_head(adapted, sharded=False) is None  # a LoRA-wrapped head
