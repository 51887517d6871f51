"""The training service's sampling parameters are checked at the door: a value that would
fail later as a server error, sample something other than asked (max_tokens 0 sampled
64 tokens) or hold the shared sampler (a huge max_tokens, thousands of stop strings) is a
400 naming the field, before the request is recorded."""

from __future__ import annotations

import pytest
from fastapi import HTTPException
from tinker import types

from streamrl.training_service.limits import ServiceLimits
from streamrl.training_service.routes import check_sampling_params


def request(**params) -> types.SampleRequest:
    prompt = types.ModelInput.from_ints([1, 2, 3])
    return types.SampleRequest(prompt=prompt, num_samples=1, sampling_params=types.SamplingParams(**params), base_model="m")


@pytest.mark.parametrize(
    "params, field",
    [
        ({"max_tokens": 0}, "sampling_params.max_tokens: from 1 to 16384"),
        ({"max_tokens": 1_000_000}, "sampling_params.max_tokens: from 1 to 16384"),
        ({"max_tokens": 8, "temperature": -1.0}, "sampling_params.temperature: a number of at least 0"),
        ({"max_tokens": 8, "temperature": float("nan")}, "sampling_params.temperature"),
        ({"max_tokens": 8, "top_p": 0.0}, "sampling_params.top_p: in (0, 1]"),
        ({"max_tokens": 8, "top_k": 0}, "sampling_params.top_k: -1 (off) or at least 1"),
        ({"max_tokens": 8, "seed": -5}, "sampling_params.seed: at least 0"),
        ({"max_tokens": 8, "stop": ["x"] * 17}, "sampling_params.stop: at most 16 entries"),
        ({"max_tokens": 8, "stop": "y" * 300}, "sampling_params.stop: at most 16 entries of at most 256 characters"),
    ],
)
def test_a_sampling_parameter_out_of_its_range_is_a_400_naming_it(params, field):
    with pytest.raises(HTTPException) as refused:
        check_sampling_params(request(**params), ServiceLimits())
    assert refused.value.status_code == 400 and field in refused.value.detail


def test_sensible_parameters_pass():
    check_sampling_params(request(max_tokens=64, temperature=0.7, top_p=0.9, top_k=50, seed=3, stop=["\n\n"]), ServiceLimits())
    check_sampling_params(request(), ServiceLimits())  # max_tokens unset: the sampler's default


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from streamrl.runtime.tiny_lm import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("sampler") / "tiny"))


def test_one_sample_request_holds_the_shared_sampler_for_a_bounded_time(tiny):
    """A max_tokens within the token limit held the sampler for hours; past
    max_sample_seconds the request now fails, saying so."""
    import torch

    from streamrl.training_service.sampler import Sampler

    with pytest.raises(ValueError, match=r"over the service's max_sample_seconds \(0 s\)"):
        Sampler(torch.device("cpu"), max_seconds=0).sample(tiny, [1, 2, 3], 2, {"max_tokens": 50, "seed": 1})
    sequences, _ = Sampler(torch.device("cpu")).sample(tiny, [1, 2, 3], 2, {"max_tokens": 5, "seed": 1, "stop": []})
    assert [(len(tokens), reason) for tokens, _, reason in sequences] == [(5, "length"), (5, "length")]


def test_a_stop_string_still_stops_a_long_answer_with_only_its_tail_decoded(tiny):
    """Stop strings are searched for in the tail a match could end in, so a long answer
    costs the same per token as a short one; a match is still found at any length."""
    import torch

    from streamrl.training_service.sampler import Sampler

    sampler = Sampler(torch.device("cpu"))
    free, _ = sampler.sample(tiny, [1, 2, 3], 1, {"max_tokens": 300, "seed": 7, "stop": []})
    tokens = free[0][0]
    tokenizer = sampler._load(tiny)[1]
    late = tokenizer.decode(tokens[:250])[-3:]  # a string the unbounded answer reaches near its end
    stopped, _ = sampler.sample(tiny, [1, 2, 3], 1, {"max_tokens": 300, "seed": 7, "stop": [late]})
    assert stopped[0][2] == "stop" and late in tokenizer.decode(stopped[0][0]) and len(stopped[0][0]) <= 250
