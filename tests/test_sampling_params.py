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
