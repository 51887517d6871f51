"""Rollouts from any OpenAI-compatible server (vLLM, SGLang's `/v1`, a hosted API).

The completions route is called with the prompt as token ids and `logprobs: 1`. What
such a server may not give, and what the recipe must accept explicitly to train anyway:

- token ids: vLLM returns them (`return_tokens_as_token_ids`); others return only text,
  and the ids StreamRL trains on are then the text re-tokenized, which need not be the
  ids the server sampled (`allow_text_round_trip: true`). A re-tokenization that does
  not give one id per returned logprob fails the rollout.
- weight sync: the API has no route to load the learner's weights, so the server keeps
  sampling from its own model and every rollout is off-policy by an unknown amount
  (`allow_unsynced_weights: true`; the trajectory records the learner's version).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from streamrl.producers.inference import Completion, InferenceUnavailable, SamplingParams, register_inference_backend
from streamrl.runtime.recipe import server_urls

log = logging.getLogger("streamrl.openai")
TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token with return_tokens_as_token_ids


def token_ids_of(tokens: list[str]) -> list[int] | None:
    """The ids of a completion's logprob tokens when the server spelled them as ids."""
    if tokens and all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
    return None


class OpenAIEngine:
    def __init__(
        self,
        urls: list[str],
        tokenizer,
        model_tag: str = "policy",
        api_key: str | None = None,
        allow_text_round_trip: bool = False,
        allow_unsynced_weights: bool = False,
        request_timeout_s: float = 600.0,
        max_retries: int = 3,
    ):
        import openai  # here, not at the top: a CLI command that only validates a recipe never needs it

        self.urls = urls
        self.tokenizer = tokenizer
        self.allow_text_round_trip = allow_text_round_trip
        self.allow_unsynced_weights = allow_unsynced_weights
        self.clients = [
            openai.OpenAI(base_url=f"{url}/v1", api_key=api_key or "none", timeout=request_timeout_s, max_retries=max_retries)
            for url in urls
        ]
        self._next = 0
        self._lock = threading.Lock()
        self.version = 0
        try:
            self.model = model_tag if model_tag != "policy" else self.clients[0].models.list().data[0].id
        except openai.APIConnectionError as exc:
            raise InferenceUnavailable(f"inference server {urls[0]} did not answer ({exc})") from None
        self._warned_round_trip = False

    def complete(self, prompt: list[int], params: SamplingParams) -> Completion:
        import openai

        with self._lock:
            url, client = self.urls[self._next % len(self.urls)], self.clients[self._next % len(self.clients)]
            self._next += 1
        extra: dict[str, Any] = {"return_tokens_as_token_ids": True}
        if params.stop_token_ids:
            extra["stop_token_ids"] = list(params.stop_token_ids)
        try:
            answer = client.completions.create(
                model=self.model,
                prompt=list(prompt),
                max_tokens=params.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                logprobs=1,
                extra_body=extra,
            )
        except openai.APIConnectionError as exc:
            raise InferenceUnavailable(f"inference server {url} did not answer ({exc})") from None
        choice = answer.choices[0]
        if choice.logprobs is None or choice.logprobs.token_logprobs is None or choice.logprobs.tokens is None:
            raise ValueError(f"inference server {url} returned no token logprobs (a completions API with logprobs=1 is needed)")
        logprobs = [float(lp) for lp in choice.logprobs.token_logprobs]
        ids = token_ids_of(list(choice.logprobs.tokens))
        if ids is None:
            ids = self._round_trip(url, choice.text, len(logprobs))
        return Completion(
            prompt_token_ids=list(prompt),
            response_token_ids=ids,
            response_text=self.tokenizer.decode(ids, skip_special_tokens=True),
            logprobs=logprobs,
            finish_reason="stop" if choice.finish_reason == "stop" else "length",
            weight_version=self.version,
        )

    def _round_trip(self, url: str, text: str, expected: int) -> list[int]:
        if not self.allow_text_round_trip:
            raise InferenceUnavailable(
                f"{url} returns text, not token ids: training would use the text re-tokenized, which may not be "
                "what the server sampled; set service.inference_service.allow_text_round_trip: true to accept that"
            )
        if not self._warned_round_trip:
            log.warning("%s returns no token ids: training on its text re-tokenized (allow_text_round_trip)", url)
            self._warned_round_trip = True
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != expected:
            raise ValueError(
                f"the re-tokenized completion has {len(ids)} tokens but the server gave {expected} "
                "logprobs: no behaviour logprob per trained token"
            )
        return ids

    def update_weights(self, model_path: str | Path, weight_version: int) -> None:
        if not self.allow_unsynced_weights:
            raise InferenceUnavailable(
                f"backend openai cannot load weight version {weight_version} into {', '.join(self.urls)}: rollouts "
                "would come from the server's own model; set service.inference_service.allow_unsynced_weights: "
                "true to train on them anyway (off-policy)"
            )
        if weight_version and self.version == 0:
            log.warning("the OpenAI-compatible server keeps its own weights (allow_unsynced_weights)")
        self.version = weight_version

    def close(self) -> None:
        for client in self.clients:
            client.close()


@register_inference_backend("openai")
def openai_backend(recipe, seed: int, settings=None, logs: Path | None = None) -> OpenAIEngine:
    from transformers import AutoTokenizer  # here: validating a recipe imports this module

    service = recipe.service.inference_service
    return OpenAIEngine(
        server_urls(service.url),
        AutoTokenizer.from_pretrained(recipe.rollout_worker.model_path),
        service.model_tag,
        service.api_key,
        service.allow_text_round_trip,
        service.allow_unsynced_weights,
        service.request_timeout_s,
        service.max_retries,
    )
