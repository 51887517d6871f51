"""The embedded inference engine: transformers in-process, for CPUs and small models.

`generate` samples a batch with a KV cache and returns, for every prompt, the sampled
token ids and their behaviour logprobs. The logprob of a token is taken from
log_softmax(logits / temperature), i.e. before top-p truncation; the learner scores
tokens with the same temperature, so the PPO ratio compares like with like.

`BatchingEngine` serves many threads (the concurrent rollouts of a worker): requests
that arrive within `max_wait_s` of each other are sampled as one batch, and a new weight
version is loaded only between batches, so one completion never mixes two policies.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from streamrl.algos.sampling import decode, row_generators, top_p_filter  # noqa: F401  (top_p_filter: callers import it from here)
from streamrl.runtime.chat_template import padding_id
from streamrl.runtime.device import resolve_device
from streamrl.runtime.registry import Registry

log = logging.getLogger(__name__)

# `service.inference_service.backend`: factories `fn(recipe, seed, settings, logs) -> front`,
# a front being what a worker's InferenceClient drives: `tokenizer`, `complete(prompt_ids,
# params) -> Completion`, `update_weights(folder, version)`, `close()`. `logs` is the
# folder for the logs of servers the backend starts.
INFERENCE_BACKENDS: Registry = Registry("inference backend", "service.inference_service.backend")
register_inference_backend = INFERENCE_BACKENDS.register


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # end the completion after sampling one of these (kept in it)
    seed: int | None = None  # this completion's own sampling seed (algos/sampling.py: request_seed)

    def __post_init__(self):
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Completion:
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_text: str
    logprobs: list[float]  # behaviour logprob of each response token
    finish_reason: str  # "stop" (end of sequence or a stop token) | "length"
    weight_version: int  # the oldest version that sampled a token of it
    token_versions: list[int] = field(default_factory=list)  # per response token, when they differ


class PromptTooLong(ValueError):
    """A task's prompt is longer than max_prompt_length: its rollout fails (and is counted
    as an over-long prompt), the worker goes on."""


class InferenceUnavailable(RuntimeError):
    """The inference service cannot serve (unreachable, crashed, refused a weight version):
    a failure of the worker's infrastructure, not of the task, so the worker stops and
    its uncommitted tasks are rolled out again after it restarts."""


def read_safetensors_weights(folder: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of a saved model folder, read straight from its safetensors files.

    Building a throw-away model with `from_pretrained` for every weight version costs
    more CPU than the rollouts of a small model; the folder's tensors are all that
    changes. Tied weights are saved once, so a missing key is filled from the tensor it
    shares storage with.
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights in this weight version")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    current = model.state_dict()
    unexpected = sorted(set(state) - set(current))
    if unexpected:
        raise KeyError(f"{folder}: weights the model does not have: {', '.join(unexpected[:5])}")
    by_storage = {current[k].data_ptr(): k for k in state}
    for key in set(current) - set(state):
        twin = by_storage.get(current[key].data_ptr())
        if twin is None:
            raise KeyError(f"{folder}: weight {key} is missing")
        state[key] = state[twin]
    return state


class EmbeddedEngine:
    def __init__(self, model_path: str | Path, weight_version: int = 0, seed: int = 0, device: str = "cpu"):
        # transformers here, not at the top: recipe validation imports this module for its
        # registry, and transformers' import is most of a CLI command's start-up
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_path)
        self.model = model.to(self.device).eval()
        self.weight_version = weight_version
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def _engine_seed(self) -> int:
        """A seed for a request that brings none, from the engine's own generator."""
        return int(torch.randint(2**62, (1,), generator=self.generator, device=self.generator.device))

    def load_weights(self, model_path: str | Path, weight_version: int) -> None:
        self.model.load_state_dict(read_safetensors_weights(Path(model_path), self.model))
        self.weight_version = weight_version

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int | None] | None = None
    ) -> list[Completion]:
        """Sample after each prompt; row i draws from its own generator, seeded by
        seeds[i] (a request without a seed gets one from the engine's generator), so a
        completion does not depend on the rest of the batch."""
        seeds = seeds if seeds is not None else [params.seed] * len(prompts)
        drawn = [s if s is not None else self._engine_seed() for s in seeds]
        decoded = decode(
            self.model,
            prompts,
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop_ids={self.tokenizer.eos_token_id, *params.stop_token_ids},
            pad_id=padding_id(self.tokenizer),
            generator=row_generators(drawn, self.device),
        )
        return [
            Completion(
                prompt_token_ids=list(prompt),
                response_token_ids=row.tokens,
                response_text=str(self.tokenizer.decode(row.tokens, skip_special_tokens=True)),
                logprobs=row.logprobs,
                finish_reason=row.finish_reason,
                weight_version=self.weight_version,
            )
            for prompt, row in zip(prompts, decoded)
        ]


@register_inference_backend("embedded")
def embedded_backend(recipe, seed: int, settings=None, logs: Path | None = None) -> BatchingEngine:
    """transformers in this process, on the recipe's model."""
    engine = EmbeddedEngine(recipe.rollout_worker.model_path, seed=seed, device=recipe.trainer.device)
    return BatchingEngine(engine, max_batch_size=recipe.service.inference_service.max_batch_size)


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: Future = field(default_factory=Future)


class BatchingEngine:
    """Thread-safe front of an EmbeddedEngine: batches concurrent requests."""

    def __init__(self, engine: EmbeddedEngine, max_batch_size: int = 64, max_wait_s: float = 0.005):
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.batch_sizes: deque[int] = deque(maxlen=10_000)  # the latest batches' sizes (a long run's stay bounded)
        self._requests: queue.Queue[_Request | None] = queue.Queue()
        self._pending_weights: tuple[Path, int] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="inference", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def submit(self, prompt: list[int], params: SamplingParams) -> Future:
        request = _Request(list(prompt), params)
        self._requests.put(request)
        return request.future

    def complete(self, prompt: list[int], params: SamplingParams) -> Completion:
        return self.submit(prompt, params).result()

    def update_weights(self, model_path: str | Path, weight_version: int) -> None:
        """Load this version before the next batch (never in the middle of one)."""
        with self._lock:
            self._pending_weights = (Path(model_path), weight_version)

    def _serve(self) -> None:
        while (first := self._requests.get()) is not None:
            batch = [first]
            try:
                while len(batch) < self.max_batch_size:
                    item = self._requests.get(timeout=self.max_wait_s)
                    if item is None:
                        self._requests.put(None)
                        break
                    batch.append(item)
            except queue.Empty:
                pass
            with self._lock:
                pending, self._pending_weights = self._pending_weights, None
            if pending:
                self.engine.load_weights(*pending)
            by_params: dict[tuple, list[_Request]] = {}
            for request in batch:
                key = (
                    request.params.max_new_tokens,
                    request.params.temperature,
                    request.params.top_p,
                    request.params.stop_token_ids,
                )
                by_params.setdefault(key, []).append(request)
            for requests in by_params.values():
                try:
                    results = self.engine.generate(
                        [r.prompt for r in requests], requests[0].params, [r.params.seed for r in requests]
                    )
                    self.batch_sizes.append(len(requests))
                    for request, result in zip(requests, results):
                        request.future.set_result(result)
                except Exception as exc:  # the callers decide (re-rollout); the engine goes on
                    for request in requests:
                        request.future.set_exception(exc)

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join(30)
        if self.batch_sizes:  # how well concurrent requests batched (the worker's log)
            requests, batches = sum(self.batch_sizes), len(self.batch_sizes)
            log.info("sampled %d requests in %d batches (mean %.1f; the latest batches)", requests, batches, requests / batches)
