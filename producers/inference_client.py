"""The inference client workers call (`self._inference_client.completion(prompt)`), and
how a trajectory's behaviour logprobs are recovered from the completions it recorded."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import as_completed
from typing import Any

from streamrl.algos.sampling import request_seed
from streamrl.producers.inference import Completion, PromptTooLong, SamplingParams
from streamrl.runtime.chat_template import ChatRenderer

log = logging.getLogger("streamrl.worker")


class InferenceClient:
    """`completion(prompt)` for workers; records the completions of the current rollout.

    `engine` is an engine front (`tokenizer`, `complete(prompt_ids, params)`): the
    embedded BatchingEngine, or an inference server's (SGLang, OpenAI-compatible).
    `chat` renders prompts (a string, or chat messages) with the model's chat template
    (`data.apply_chat_template`); a prompt of token ids is sent as it is."""

    def __init__(
        self,
        engine,
        defaults: SamplingParams,
        val_defaults: SamplingParams | None = None,
        max_prompt_tokens: int | None = None,
        chat: ChatRenderer | None = None,
        run_seed: int | None = None,
    ):
        """`run_seed`: each completion of a rollout begun with a key (`begin`) samples with
        its own seed, from this and the key (algos/sampling.py: request_seed)."""
        self._engine = engine
        self._run_seed = run_seed
        self._chat = chat
        self.max_prompt_tokens = max_prompt_tokens  # a task's prompt may not be longer (in tokens)
        self._train_defaults = defaults
        self._val_defaults = val_defaults or defaults
        self._local = threading.local()
        self._warned_max_tokens = False
        # A group's rollouts share their prompt, so most prompts are tokenised again
        # and again; the tokenizer's call costs more than a small model's sampling step.
        self._prompt_ids = functools.lru_cache(maxsize=4096)(
            lambda prompt: tuple(self.chat.prompt_ids(json.loads(prompt[1:]) if prompt.startswith("\x00") else prompt))
        )

    @property
    def _defaults(self) -> SamplingParams:
        # Validation rollouts sample with the validation settings (greedy by default).
        return self._val_defaults if getattr(self._local, "is_val", False) else self._train_defaults

    @property
    def tokenizer(self):
        return self._engine.tokenizer

    @property
    def chat(self) -> ChatRenderer:
        if self._chat is None:  # built on first use: a server engine's tokenizer loads with it
            self._chat = ChatRenderer(self.tokenizer)
        return self._chat

    def tokenize(self, prompt: str | list[dict[str, Any]]) -> list[int]:
        """The ids a prompt is sent as: text or chat messages through the chat template
        (or raw text, `apply_chat_template: false`)."""
        key = prompt if isinstance(prompt, str) and not prompt.startswith("\x00") else "\x00" + json.dumps(prompt)
        return list(self._prompt_ids(key))

    def begin(self, is_val: bool = False, seed_key: str | None = None) -> None:
        """A new rollout in this thread; `seed_key` (the task and its try) seeds its
        completions, the first with `seed_key/0`, the next `seed_key/1`, ..."""
        self._local.completions = []
        self._local.is_val = is_val
        self._local.seed_key = seed_key
        self._local.calls = 0

    def _next_seed(self, seed_key: str | None = None, call: int | None = None) -> int | None:
        """The seed of this thread's next completion (None: the engine's own generator)."""
        key = seed_key if seed_key is not None else getattr(self._local, "seed_key", None)
        if self._run_seed is None or key is None:
            return None
        if call is None:
            call = self._local.calls
            self._local.calls += 1
        return request_seed(self._run_seed, f"{key}/{call}")

    def recorded(self) -> list[Completion]:
        return list(getattr(self._local, "completions", []))

    def completion(
        self,
        prompt: str | list[int] | list[dict[str, Any]],
        temperature: float | None = None,
        max_tokens: int | None = None,
        top_p: float | None = None,
        stop_token_ids: list[int] | tuple[int, ...] = (),
    ) -> dict[str, Any]:
        """Sample after `prompt`, for any worker: the rollout's first prompt may not pass
        `max_prompt_length` (the rollout fails, with the numbers) and no completion samples
        more than `max_response_length` tokens (a larger `max_tokens` is lowered to it,
        said once in the log)."""
        is_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        prompt_ids = list(prompt) if is_ids else self.tokenize(prompt)  # type: ignore[arg-type]  # not ids: text or messages
        first_call = not getattr(self._local, "completions", None)
        if first_call and self.max_prompt_tokens is not None and len(prompt_ids) > self.max_prompt_tokens:
            limit = self.max_prompt_tokens
            raise PromptTooLong(f"the prompt has {len(prompt_ids)} tokens, more than max_prompt_length ({limit})")
        limit = self._defaults.max_new_tokens
        if max_tokens is not None and max_tokens > limit:
            if not self._warned_max_tokens:
                self._warned_max_tokens = True
                log.warning(
                    "a worker asked for max_tokens=%d: completions are capped at max_response_length (%d)", max_tokens, limit
                )
            max_tokens = limit
        params = SamplingParams(
            max_new_tokens=max_tokens if max_tokens is not None else self._defaults.max_new_tokens,
            temperature=temperature if temperature is not None else self._defaults.temperature,
            top_p=top_p if top_p is not None else self._defaults.top_p,
            stop_token_ids=tuple(stop_token_ids),
            seed=self._next_seed(),
        )
        return self.record(self._engine.complete(prompt_ids, params))

    @property
    def batches(self) -> bool:
        """Whether the engine takes many requests from one thread (`submit`: the embedded
        engine's batching front); a server's front is driven one request per thread."""
        return hasattr(self._engine, "submit")

    def submit_each(self, requests: list[tuple[list[int], bool, str | None]]) -> Iterator[tuple[int, Completion | BaseException]]:
        """Sample each (prompt ids, is_val, seed key) with the train or validation defaults,
        all submitted at once so the engine samples them as one batch; yields (the
        request's index, its completion or the exception it raised) as each finishes.
        Each is the first completion of a rollout begun with that seed key. Needs an
        engine that `batches`."""
        futures = {
            self._engine.submit(
                list(prompt),
                dataclasses.replace(self._val_defaults if is_val else self._train_defaults, seed=self._next_seed(key, 0)),
            ): index
            for index, (prompt, is_val, key) in enumerate(requests)
        }
        for future in as_completed(futures):
            yield futures[future], future.exception() or future.result()

    def record(self, result: Completion) -> dict[str, Any]:
        """Count `result` as a completion of the current rollout; the worker's view of it."""
        if hasattr(self._local, "completions"):
            self._local.completions.append(result)
        return {
            "prompt_tokens": result.prompt_token_ids,
            "response_tokens": result.response_token_ids,
            "response": result.response_text,
            "logprobs": result.logprobs,
            "finish_reason": result.finish_reason,
            "weight_version": result.weight_version,
            "token_versions": result.token_versions or [result.weight_version] * len(result.response_token_ids),
        }


def behaviour_logprobs(tokens: list[int], loss_mask: list[int], completions: list[Completion]) -> tuple[list[float], list[int]]:
    """Per-token behaviour logprobs and the weight version that sampled each token: each
    completion's response is found in `tokens` (in order: right after the completion's
    prompt where the trajectory begins with it, else searching forward); tokens no
    completion sampled get 0 and version 0. Raises ValueError if a trained token was not
    sampled by any completion."""
    logprobs = [0.0] * len(tokens)
    versions = [0] * len(tokens)
    sampled = [False] * len(tokens)
    cursor = 0
    for completion in completions:
        response = completion.response_token_ids
        if not response:
            continue
        # where it was sampled: right after its own prompt, when the trajectory holds that
        # prompt; a forward search alone would take an earlier copy of the same tokens (a
        # response that repeats the prompt's last token)
        after_prompt = len(completion.prompt_token_ids)
        starts: Iterable[int] = range(cursor, len(tokens) - len(response) + 1)
        if cursor <= after_prompt and tokens[:after_prompt] == list(completion.prompt_token_ids):
            starts = itertools.chain([after_prompt], starts)
        for start in starts:
            if tokens[start : start + len(response)] == response:
                logprobs[start : start + len(response)] = completion.logprobs
                versions[start : start + len(response)] = completion.token_versions or [completion.weight_version] * len(response)
                sampled[start : start + len(response)] = [True] * len(response)
                cursor = start + len(response)
                break
    unsampled = [i for i, (m, s) in enumerate(zip(loss_mask, sampled)) if m and not s]
    if unsampled:
        raise ValueError(
            f"{len(unsampled)} trained token(s) (first at position {unsampled[0]}) were not "
            "sampled by any completion of this rollout: no behaviour logprob to train with"
        )
    return logprobs, versions
