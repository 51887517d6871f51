"""The pieces of the inference-server path that need no server: the logprob-gap maths
(hand-computed), which recipe keys each backend reads, SGLang's launch flags, parsing a
/generate answer, behaviour logprobs and versions of a resumed completion, and the
sampling seed each SGLang request carries."""

from __future__ import annotations

import pytest
import torch

from streamrl.learner.step_metrics import logprob_gap_by_lag, logprob_gap_sums
from streamrl.producers.inference import Completion, SamplingParams
from streamrl.producers.rollout import behaviour_logprobs
from streamrl.producers.sglang_engine import Server, SGLangEngine, parse_generate
from streamrl.producers.sglang_server import launch_options, server_flags
from streamrl.runtime.config import Recipe
from streamrl.runtime.recipe import RecipeError, consistency_problems, server_urls, with_inference_url


def test_logprob_gap_by_lag_is_the_mean_and_max_absolute_difference():
    # two sequences, four positions; position 0 of each is a prompt token (mask 0)
    learner = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.1, -0.2, -3.0]])
    behaviour = torch.tensor([[9.0, -1.5, -2.0, -0.25], [9.0, -0.1, -0.7, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    lag = torch.tensor([[0, 0, 0, 1], [0, 2, 3, 3]], dtype=torch.int32)
    sums = {k: float(v) for k, v in logprob_gap_sums(learner, behaviour, mask, lag).items()}
    # gaps of the trained tokens: 0.5, 0, 0.25 (first row), 0, 0.5 (second row)
    assert sums["logprob_gap_mean_sum"] == pytest.approx(1.25)
    assert sums["logprob_gap_max"] == pytest.approx(0.5)
    metrics = logprob_gap_by_lag({k: v for k, v in sums.items() if k.startswith(("gap_lag", "tokens_lag"))})
    assert metrics["tokens_lag0"] == 2 and metrics["logprob_gap_mean_lag0"] == pytest.approx(0.25)
    assert metrics["logprob_gap_max_lag0"] == pytest.approx(0.5)
    assert metrics["tokens_lag1"] == 1 and metrics["logprob_gap_mean_lag1"] == pytest.approx(0.25)
    assert metrics["tokens_lag2plus"] == 2 and metrics["logprob_gap_mean_lag2plus"] == pytest.approx(0.25)
    assert metrics["logprob_gap_max_lag2plus"] == pytest.approx(0.5)


def test_an_empty_lag_bucket_has_no_mean():
    metrics = logprob_gap_by_lag({"gap_lag0": 0.0, "tokens_lag0": 0.0, "gap_lag0_max": 0.0})
    assert metrics["tokens_lag0"] == 0 and "logprob_gap_mean_lag0" not in metrics


def service(**keys) -> Recipe:
    return Recipe.from_dict({"service": {"inference_service": keys}})


def test_keys_a_backend_does_not_read_are_refused():
    assert consistency_problems(service()) == []
    assert consistency_problems(service(backend="sglang", server_args={"mem-fraction-static": 0.8})) == []
    problems = consistency_problems(service(url="http://h:1", partial_rollout="redo"))
    assert "service.inference_service.url: not used by backend embedded (only by sglang and openai)" in problems
    assert any(p.startswith("service.inference_service.partial_rollout: only weight.sync_mode fully-async") for p in problems)
    assert consistency_problems(service(backend="openai")) == [
        "service.inference_service.url: backend openai needs the server's url"
    ]
    assert consistency_problems(service(backend="sglang", url="h:1", server_args={"x": 1})) == [
        "service.inference_service.server_args: for managed servers only; with url the servers are the ones listed"
    ]
    assert consistency_problems(service(backend="sglang", allow_text_round_trip=True)) == [
        "service.inference_service.allow_text_round_trip: not used by backend sglang (only by openai)"
    ]


def test_inference_url_replaces_the_managed_servers():
    recipe = service(backend="sglang", num_servers=2, server_args={"x": 1})
    external = with_inference_url(recipe, ["h:30000", "https://g/"])
    assert external.service.inference_service.url == ["http://h:30000", "https://g"]
    assert external.service.inference_service.num_servers == 1 and external.service.inference_service.server_args == {}
    assert consistency_problems(external) == []
    with pytest.raises(RecipeError, match="needs backend sglang or openai"):
        with_inference_url(service(), ["h:1"])
    assert server_urls("h:1") == ["http://h:1"]


def test_launch_flags_on_the_cpu_and_a_recipes_server_args_win():
    options = launch_options("/m", 30001, "cpu", {"mem_fraction_static": 0.5, "dtype": "bfloat16"})
    flags = server_flags(options)
    assert flags[:6] == ["--model-path", "/m", "--host", "127.0.0.1", "--port", "30001"]
    assert "--disable-cuda-graph" in flags and flags[flags.index("--dtype") + 1] == "bfloat16"
    assert flags[flags.index("--mem-fraction-static") + 1] == "0.5"
    assert "--sleep-on-idle" in flags  # an idle server waits on its sockets, not polling them
    assert "--sleep-on-idle" not in server_flags(launch_options("/m", 30001, "cpu", {"sleep_on_idle": False}))
    assert server_flags({"a": False, "b": None, "c": [1, 2]}) == ["--c", "1", "2"]


def test_parse_generate_reads_ids_logprobs_reason_and_version():
    body = {
        "output_ids": [5, 6],
        "meta_info": {
            "output_token_logprobs": [[-0.5, 5, None], [-1.5, 6, None]],
            "finish_reason": {"type": "abort"},
            "weight_version": "7",
        },
    }
    out = parse_generate(body)
    assert (out.token_ids, out.logprobs, out.finish_reason, out.weight_version) == ([5, 6], [-0.5, -1.5], "abort", "7")


def test_a_resumed_completion_gives_each_token_its_version():
    completion = Completion(
        prompt_token_ids=[1, 2],
        response_token_ids=[7, 8, 9],
        response_text="",
        logprobs=[-0.1, -0.2, -0.3],
        finish_reason="stop",
        weight_version=4,
        token_versions=[4, 5, 5],
    )
    logprobs, versions = behaviour_logprobs([1, 2, 7, 8, 9], [0, 0, 1, 1, 1], [completion])
    assert logprobs == [0.0, 0.0, -0.1, -0.2, -0.3] and versions == [0, 0, 4, 5, 5]


def test_a_response_that_repeats_the_prompts_last_token_is_found_after_its_prompt():
    """ "3+4=" then "7": the sampled 7 sits after the prompt, not at the prompt's own 7
    ("1+7=" ... ), which a forward search from the start would take."""
    completion = Completion(
        prompt_token_ids=[1, 7, 2],
        response_token_ids=[7],
        response_text="",
        logprobs=[-0.25],
        finish_reason="length",
        weight_version=3,
    )
    logprobs, versions = behaviour_logprobs([1, 7, 2, 7], [0, 0, 0, 1], [completion])
    assert logprobs == [0.0, 0.0, 0.0, -0.25] and versions == [0, 0, 0, 3]


def test_each_sglang_request_carries_its_completions_sampling_seed():
    """The seed reaches SGLang's sampling_params as `sampling_seed` (SGLang draws from it on
    a server with --enable-deterministic-inference); a request without one sends none."""
    sent = []

    def answer(server, route, payload):
        sent.append(payload)
        return {"output_ids": [5], "meta_info": {"output_token_logprobs": [[-0.5, 5, None]]}}

    engine = SGLangEngine([Server("http://127.0.0.1:1")], tokenizer=None)
    engine._post = answer  # type: ignore[method-assign]
    engine._generate(engine.servers[0], [1, 2], SamplingParams(max_new_tokens=1, seed=2**63 - 1), 1)
    engine._generate(engine.servers[0], [1, 2], SamplingParams(max_new_tokens=1), 1)
    assert sent[0]["sampling_params"]["sampling_seed"] == 2**63 - 1
    assert "sampling_seed" not in sent[1]["sampling_params"]
