"""The cluster twin's modelled GPUs (producers/modelled_engine.py) against times worked
out by hand, on a clock the test drives."""

from __future__ import annotations

import pytest

from streamrl.producers.inference import SamplingParams
from streamrl.producers.modelled_engine import ModelledGpus, token_versions
from streamrl.runtime.gpu_model import TwinModel, ideal_rollouts_per_s, prefill_s, train_s


class Vocabulary:
    """What the engine reads of a tokenizer: its size and its special ids."""

    all_special_ids = (0,)
    eos_token_id = 0

    def __len__(self) -> int:
        return 50


# 33.5 GB of weights read at 3.35 TB/s: 10 ms a decode step; a sequence of a 40-token
# prompt and 120 tokens of answer counts 40 + 60 tokens of KV cache, 335 MB a token: +10 ms.
MODEL = TwinModel(
    params_b=16.75,
    kv_bytes_per_token=335_000_000,
    inference_gpus=2,
    bandwidth_efficiency=1.0,
    prefill_mfu=0.5,
    weight_sync_s=0.5,
    response_median=120,
    response_sigma=0.0,
)
PREFILL = 2 * 16.75e9 * 40 / (989e12 * 0.5)  # 2.7098 ms


def engine() -> ModelledGpus:
    gpus = ModelledGpus(MODEL, Vocabulary(), seed=0, start=False)
    gpus.last = 0.0
    return gpus


def test_the_formulas_by_hand():
    assert prefill_s(MODEL, 40) == pytest.approx(0.0027098, rel=1e-4)
    # 6 x 8e9 FLOPs a token on 8 GPUs at 40% of 989 TFLOPS: 10,000 tokens take 0.15167 s
    assert train_s(TwinModel(), 10_000) == pytest.approx(0.151668, rel=1e-4)
    assert token_versions([(0, 3), (2, 4)], 5) == [3, 3, 4, 4, 4]


def test_a_group_shares_its_prefill_and_its_gpu_and_the_batch_slows_each_step():
    gpus = engine()
    params = SamplingParams(max_new_tokens=1000)
    first, second = gpus.submit([7] * 40, params), gpus.submit([7] * 40, params)
    assert gpus.step(0.0) == []
    assert list(gpus.running) == [2, 0]  # the second found its prompt prefilled on GPU 0
    # both decode together after one prefill: 120 steps of 10 + 2 x 10 ms
    assert gpus._next_event(0.0) == pytest.approx(PREFILL + 3.6)
    assert gpus.step(PREFILL + 3.6 - 1e-6) == []
    done = gpus.step(PREFILL + 3.6)
    assert {s.future for s in done} == {first, second}
    assert gpus.decoding_s.sum() == pytest.approx(3.6)


def test_another_prompt_goes_to_the_idle_gpu_and_a_weight_update_pauses_every_gpu():
    gpus = engine()
    params = SamplingParams(max_new_tokens=1000)
    gpus.submit([7] * 40, params)
    gpus.submit([8] * 40, params)
    gpus.step(0.0)
    assert list(gpus.running) == [1, 1]
    # alone on its GPU a sequence steps in 20 ms: 60 tokens by 1.2 s after its prefill
    gpus.update_weights("unused", 1, now=PREFILL + 1.2)
    assert gpus._next_event(PREFILL + 1.2) == pytest.approx(PREFILL + 2.4 + 0.5)
    done = gpus.step(PREFILL + 2.4 + 0.5)
    assert len(done) == 2
    completion = gpus._completion(done[0])
    assert completion.weight_version == 0
    assert completion.token_versions == [0] * 60 + [1] * 60
    assert len(completion.response_token_ids) == len(completion.logprobs) == 120
    assert completion.finish_reason == "stop" and completion.response_token_ids[-1] == 0


def test_a_full_gpu_makes_requests_wait():
    model = TwinModel(inference_gpus=1, max_running=1, response_median=10, response_sigma=0.0)
    gpus = ModelledGpus(model, Vocabulary(), seed=0, start=False)
    gpus.last = 0.0
    gpus.submit([1] * 8, SamplingParams(max_new_tokens=5))
    gpus.submit([2] * 8, SamplingParams(max_new_tokens=5))
    gpus.step(0.0)
    assert list(gpus.running) == [1] and len(gpus.waiting) == 1
    done = gpus.step(gpus._next_event(0.0))
    assert len(done) == 1 and len(gpus.waiting) == 0 and list(gpus.running) == [1]
    assert gpus._completion(done[0]).finish_reason == "length"  # cut at max_new_tokens 5 of the drawn 10


def test_the_ideal_schedule_is_the_slower_side_and_sync_their_sum():
    ideal = ideal_rollouts_per_s(TwinModel(), group_size=8, rollouts_per_step=512)
    assert ideal["async"] == min(ideal["generation"], ideal["training"])
    assert 1 / ideal["sync"] == pytest.approx(1 / ideal["generation"] + 1 / ideal["training"])


def test_a_recipe_cannot_choose_the_modelled_gpus(tmp_path):
    from streamrl.checks import recipe_code_problems
    from streamrl.runtime.recipe import load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("service:\n  inference_service:\n    backend: modelled\n")
    assert (
        "service.inference_service.backend: inference backend 'modelled' is chosen by code, not by a recipe; "
        "a recipe may name: embedded, openai, sglang"
    ) in recipe_code_problems(load_recipe(recipe))


def test_a_twin_model_that_cannot_be_is_refused_by_field(monkeypatch):
    from streamrl.runtime.gpu_model import TWIN_ENV, twin_from_env

    with pytest.raises(ValueError, match=r"inference_gpus must be >= 1; train_mfu must be in \(0, 1\]"):
        TwinModel(inference_gpus=0, train_mfu=1.5)
    with pytest.raises(ValueError, match=r"prompt_tokens must be \(low, high\)"):
        TwinModel(prompt_tokens=(4096, 512))
    monkeypatch.setenv(TWIN_ENV, "{not json")
    with pytest.raises(ValueError, match="STREAMRL_CLUSTER_TWIN: not JSON"):
        twin_from_env()
    monkeypatch.setenv(TWIN_ENV, '{"gpus": 8}')
    with pytest.raises(ValueError, match=r"STREAMRL_CLUSTER_TWIN: unknown fields \['gpus'\]"):
        twin_from_env()
    monkeypatch.setenv(TWIN_ENV, TwinModel(inference_gpus=3).to_env())
    assert twin_from_env() == TwinModel(inference_gpus=3)


def test_the_ideal_counts_the_context_each_generated_token_reads():
    """By hand: answers of exactly 1,001 tokens (sigma 0) after prompts of 1,000: token i
    of an answer reads 1,000 + i tokens of cache, 1,500 on average. A decode step of 32
    such sequences reads 16 GB of weights and 32 x 1,500 x 131,072 bytes of cache at 60%
    of 3.35 TB/s; a rollout takes 1,001 of its steps' 32 shares, 1/8 of its prompt's
    prefill (2 x 8e9 x 1,000 FLOPs at 50% of 989 TFLOPS), and, with a version every 256
    rollouts on 8 GPUs, 1/32 of a GPU's 1 s weight-sync pause."""
    from streamrl.runtime.gpu_model import mean_decode_context

    model = TwinModel(inference_gpus=8, max_running=32, prompt_tokens=(1000, 1000), response_median=1001, response_sigma=0)
    assert mean_decode_context(model) == 1500.0
    step_s = (16e9 + 32 * 1500 * 131_072) / (3.35e12 * 0.6)
    rollout_s = 1001 * step_s / 32 + 2 * 8e9 * 1000 / (989e12 * 0.5) / 8 + 1.0 / 32
    ideal = ideal_rollouts_per_s(model, group_size=8, rollouts_per_step=256)
    assert ideal["generation"] == pytest.approx(8 / rollout_s, rel=1e-12)
