"""Behaviour logprobs land on the tokens that were sampled: each completion's response is
placed right after its own prompt when the trajectory extends that prompt (a single turn,
or a conversation that grows turn by turn), whatever tokens repeat. Property tests over a
four-token alphabet, so prompts and responses repeat each other's tokens often."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.producers.inference import Completion
from streamrl.producers.inference_client import behaviour_logprobs

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=12)


def completion(prompt: list[int], response: list[int], version: int, first_logprob: float) -> Completion:
    logprobs = [first_logprob - 0.01 * i for i in range(len(response))]  # distinct, so a shifted copy is seen
    return Completion(list(prompt), list(response), "", logprobs, "length", version)


def test_a_response_that_repeats_the_prompts_last_token():
    # the minimal case: a search for [9, 9, 9] in the whole sequence would start one early
    sampled = completion([5, 7, 9], [9, 9, 9], 1, -0.1)
    logprobs, versions = behaviour_logprobs([5, 7, 9, 9, 9, 9], [0, 0, 0, 1, 1, 1], [sampled])
    assert logprobs == [0.0, 0.0, 0.0, *sampled.logprobs] and versions == [0, 0, 0, 1, 1, 1]


@settings(max_examples=300, deadline=None)
@given(prompt=TOKENS, response=TOKENS)
def test_a_single_turns_logprobs_are_the_responses_positions(prompt, response):
    sampled = completion(prompt, response, 3, -0.5)
    tokens, mask = prompt + response, [0] * len(prompt) + [1] * len(response)
    logprobs, versions = behaviour_logprobs(tokens, mask, [sampled])
    assert logprobs == [0.0] * len(prompt) + sampled.logprobs
    assert versions == [0] * len(prompt) + [3] * len(response)


@settings(max_examples=300, deadline=None)
@given(turns=st.lists(st.tuples(TOKENS, TOKENS), min_size=1, max_size=4), first=TOKENS)
def test_a_growing_conversations_logprobs_are_each_turns_positions(turns, first):
    """Each turn: the text between the model's turns (a tool result, a user reply), then
    the model's sampled response to everything so far."""
    tokens, mask, expected, expected_versions, completions = (
        list(first),
        [0] * len(first),
        [0.0] * len(first),
        [0] * len(first),
        [],
    )
    for index, (between, response) in enumerate(turns):
        if index:
            tokens, mask = tokens + between, mask + [0] * len(between)
            expected, expected_versions = expected + [0.0] * len(between), expected_versions + [0] * len(between)
        sampled = completion(tokens, response, index + 1, -1.0 - index)
        completions.append(sampled)
        tokens, mask = tokens + response, mask + [1] * len(response)
        expected, expected_versions = expected + sampled.logprobs, expected_versions + [index + 1] * len(response)
    logprobs, versions = behaviour_logprobs(tokens, mask, completions)
    assert logprobs == expected and versions == expected_versions
