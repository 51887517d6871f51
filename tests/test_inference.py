"""The embedded engine against the model it serves."""

import math
import re
import threading

import pytest
import torch

from streamrl.algos.sampling import request_seed
from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams, top_p_filter
from streamrl.runtime.tiny_lm import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("engine") / "model", seed=1)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7 <= 0.8
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()


def test_sampled_logprobs_equal_the_models_own_scores(model_dir):
    engine = EmbeddedEngine(model_dir, seed=0)
    tok = engine.tokenizer
    prompts = [tok("7+8=")["input_ids"], tok("123+456=")["input_ids"], tok("1=")["input_ids"]]
    params = SamplingParams(max_new_tokens=12, temperature=0.7)
    completions = engine.generate(prompts, params)
    for completion in completions:
        assert completion.response_token_ids and len(completion.logprobs) == len(completion.response_token_ids)
        sequence = torch.tensor([completion.prompt_token_ids + completion.response_token_ids])
        with torch.no_grad():
            logits = engine.model(sequence).logits[0].float() / 0.7
        log_probs = torch.log_softmax(logits, dim=-1)
        start = len(completion.prompt_token_ids)
        expected = [float(log_probs[start + i - 1, t]) for i, t in enumerate(completion.response_token_ids)]
        assert completion.logprobs == pytest.approx(expected, abs=1e-4)  # left padding + cache are exact
        assert completion.finish_reason in ("stop", "length")
        if completion.finish_reason == "length":
            assert len(completion.response_token_ids) == 12


def test_tiny_top_p_is_greedy(model_dir):
    engine = EmbeddedEngine(model_dir, seed=5)
    prompt = engine.tokenizer("42+1=")["input_ids"]
    ours = engine.generate([prompt], SamplingParams(max_new_tokens=6, top_p=1e-6))[0]
    with torch.no_grad():
        greedy = engine.model.generate(
            torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=engine.tokenizer.pad_token_id
        )[0, len(prompt) :].tolist()
    assert ours.response_token_ids == greedy[: len(ours.response_token_ids)]
    exact = engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0))[0]
    assert exact.response_token_ids == greedy[: len(exact.response_token_ids)]


def test_bad_sampling_params_are_refused():
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=1.5)


def test_concurrent_requests_are_batched_and_weights_change_between_batches(model_dir, tmp_path):
    server = BatchingEngine(EmbeddedEngine(model_dir), max_batch_size=16, max_wait_s=0.05)
    prompt = server.tokenizer("5+5=")["input_ids"]
    params = SamplingParams(max_new_tokens=4)
    results = [None] * 8
    barrier = threading.Barrier(8)

    def ask(i):
        barrier.wait()
        results[i] = server.submit(prompt, params).result(60)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.weight_version == 0 for r in results)
    assert max(server.batch_sizes) > 1

    other = build_tiny_model(tmp_path / "v1", seed=99)
    server.update_weights(other, 1)
    after = server.submit(prompt, params).result(60)
    assert after.weight_version == 1
    fresh = EmbeddedEngine(other)
    assert all(torch.equal(a, b) for a, b in zip(server.engine.model.state_dict().values(), fresh.model.state_dict().values()))
    server.close()


def test_a_weight_version_that_does_not_fit_the_model_is_refused_by_name(model_dir, tmp_path):
    engine = EmbeddedEngine(model_dir)
    with pytest.raises(FileNotFoundError, match=re.escape("no *.safetensors")):
        engine.load_weights(tmp_path, 3)
    bigger = build_tiny_model(tmp_path / "bigger", seed=2, layers=3)
    with pytest.raises(KeyError, match=re.escape("model.layers.2")):
        engine.load_weights(bigger, 3)
    assert engine.weight_version == 0


def test_one_draw_for_every_sampler_top_k_and_the_logprob_before_the_filters():
    from streamrl.algos.sampling import draw_tokens, top_k_filter

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[True, True, False]]
    assert torch.isfinite(top_k_filter(logits, 0)).all()
    # top-k 1 leaves one token to draw; its logprob is under the unfiltered distribution
    # (what the learner recomputes): ln 0.5, not ln 1
    chosen, logprob = draw_tokens(logits, temperature=1.0, top_k=1)
    assert chosen.tolist() == [0] and logprob.item() == pytest.approx(math.log(0.5), abs=1e-6)
    # temperature 2: p ~ sqrt([0.5, 0.3, 0.2]) = [0.7071, 0.5477, 0.4472] / 1.7020
    chosen, logprob = draw_tokens(logits, temperature=2.0, top_k=1)
    assert logprob.item() == pytest.approx(math.log(0.7071068 / 1.7020312), abs=1e-5)


def test_the_inverse_cdf_draw_follows_the_distribution_and_never_draws_a_zero():
    from streamrl.algos.sampling import inverse_cdf_draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(200_000, 1)
    drawn = inverse_cdf_draw(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(drawn, minlength=6).float() / len(drawn)
    assert counts[[0, 2, 5]].sum() == 0  # probability 0: never
    # 200k draws: a frequency's standard error is at most sqrt(0.25 / 200k) = 0.0011
    assert counts[[1, 3, 4]].tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.005)
    edge = inverse_cdf_draw(torch.tensor([[0.0, 0.0, 1.0]]).repeat(1000, 1))
    assert edge.tolist() == [2] * 1000


def test_a_completion_samples_the_same_whatever_it_is_batched_with(model_dir):
    """Each request draws from a generator seeded by its own seed (algos/sampling.py:
    request_seed): alone, in a batch of eight or behind other prompts, a request gives the
    same tokens; another seed gives other tokens."""
    engine = EmbeddedEngine(model_dir, seed=0)
    tok = engine.tokenizer
    prompts = [tok(f"{a}+{a * 7 % 100}=")["input_ids"] for a in range(8)]
    seeds = [request_seed(3, f"s000001-g0000-{i}/2/0") for i in range(8)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    together = [c.response_token_ids for c in engine.generate(prompts, params, seeds)]
    alone = [engine.generate([p], params, [s])[0].response_token_ids for p, s in zip(prompts, seeds)]
    reversed_order = [c.response_token_ids for c in engine.generate(prompts[::-1], params, seeds[::-1])][::-1]
    assert together == alone == reversed_order
    others = [c.response_token_ids for c in engine.generate(prompts, params, [s + 1 for s in seeds])]
    assert others != together
    assert request_seed(3, "s000001-g0000-0/2/0") == seeds[0] != request_seed(4, "s000001-g0000-0/2/0")
