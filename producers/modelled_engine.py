"""The cluster twin's inference backend ("modelled"): GPUs that answer in the time real
ones would take (runtime/gpu_model.py), with real-sized answers, and no model.

Each modelled GPU batches continuously: the sequences it runs advance one token per
decode step, whose time grows with the KV cache they hold. A request goes to the GPU
that prefilled its prompt before (a group shares its prompt) while that one has room,
else to the least busy; a prefill holds its GPU's decoding for the prefill's time. A new
weight version pauses every GPU for `weight_sync_s`; the sequences running then go on
with the new version (SGLang's partial rollouts), and their tokens say which version
sampled them. Time is kept with a virtual token clock per GPU (in processor sharing
every running sequence has decoded the same number of tokens since the GPU started),
so each event costs O(log n) and a numpy pass over the GPUs.

Only bench/cluster_twin.py chooses this backend (through STREAMRL_CLUSTER_TWIN): a
recipe naming it is refused. The GPUs' busy seconds go to the run's logs
(`engine-twin-<seed>.jsonl`) for the bench.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import logging
import string
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from streamrl.producers.inference import Completion, SamplingParams, register_inference_backend
from streamrl.runtime.gpu_model import TwinModel, decode_step_s, prefill_s, response_lengths, twin_from_env

log = logging.getLogger(__name__)

PREFIX_CACHE_PROMPTS = 4096  # prompts a GPU remembers having prefilled (an LRU)
TEXT_CHARS_PER_TOKEN = 4  # a response's text as a BPE tokenizer's would be, about


@dataclass
class _Sequence:
    prompt: list[int]
    params: SamplingParams
    length: int
    future: Future = field(default_factory=Future)
    gpu: int = -1
    started_at: float = 0.0  # the GPU's virtual clock when it joined the batch
    context: float = 0.0  # the KV tokens it is counted for while it runs
    versions: list[tuple[int, int]] = field(default_factory=list)  # (tokens done, version from then on)


def token_versions(switches: list[tuple[int, int]], length: int) -> list[int]:
    """Each token's weight version, from (tokens done when it came, version) switches."""
    versions = np.empty(length, dtype=np.int64)
    for (done, version), (until, _) in itertools.pairwise([*switches, (length, -1)]):
        versions[min(done, length) : min(until, length)] = version
    return versions.tolist()


class ModelledGpus:
    """`model.inference_gpus` GPUs serving one worker's requests in modelled time."""

    def __init__(self, model: TwinModel, tokenizer, seed: int, stats_path: Path | None = None, start: bool = True):
        """`start`: serve from a thread of its own, in wall-clock time (tests drive `step`)."""
        self.model, self.tokenizer, self.stats_path = model, tokenizer, stats_path
        self.rng = np.random.default_rng(seed)
        n = model.inference_gpus
        self.clock = np.zeros(n)  # tokens each running sequence of a GPU has decoded since it started
        self.running = np.zeros(n, dtype=np.int64)
        self.context = np.zeros(n)  # KV tokens held by a GPU's running sequences
        self.prefill_until = np.zeros(n)  # wall-clock: the GPU prefills, it does not decode
        self.next_finish = np.full(n, np.inf)  # the clock at which the GPU's next sequence ends
        self.decoding_s = np.zeros(n)
        self.running_s = np.zeros(n)  # sequence-seconds decoded: over decoding_s, the mean batch
        self.unasked_slot_s = 0.0  # slot-seconds a decoding GPU left free while no request waited
        self.prefill_busy_s = np.zeros(n)
        self.sync_until = 0.0
        self.sync_pauses = 0
        self.finishing: list[list[tuple[float, int, _Sequence]]] = [[] for _ in range(n)]
        self.prefilled: OrderedDict[bytes, int] = OrderedDict()
        self.waiting: deque[_Sequence] = deque()
        self.version = 0
        self.order = itertools.count()
        self.last = self.started = time.monotonic()
        self.served = 0
        self.vocab = self._vocabulary()
        self.text = "".join(self.rng.choice(list(string.ascii_letters + " "), 1 << 20))
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name="modelled-gpus", daemon=True)
        self.stats_every_s, self.stats_at = 1.0, 0.0
        if start:
            self.thread.start()

    def _vocabulary(self) -> np.ndarray:
        special = set(self.tokenizer.all_special_ids)
        return np.array([i for i in range(len(self.tokenizer)) if i not in special], dtype=np.int64)

    # --- the front a worker's InferenceClient drives ----------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams) -> Future:
        length = int(min(response_lengths(self.model, self.rng, 1)[0], max(params.max_new_tokens, 1)))
        sequence = _Sequence(list(prompt), params, length)
        with self.cond:
            self.waiting.append(sequence)
            self.cond.notify()
        return sequence.future

    def complete(self, prompt: list[int], params: SamplingParams) -> Completion:
        return self.submit(prompt, params).result()

    def update_weights(self, model_path: str | Path, weight_version: int, broadcast=None, now: float | None = None) -> None:
        """Every GPU pauses to take the version (a broadcast one too: the same pause);
        running sequences go on with it."""
        with self.cond:
            now = time.monotonic() if now is None else now
            self._advance(now)
            self.sync_until = max(self.sync_until, now) + self.model.weight_sync_s / self.model.time_scale
            self.sync_pauses += 1
            self.version = weight_version
            for heap in self.finishing:
                for _, _, sequence in heap:
                    done = int(self.clock[sequence.gpu] - sequence.started_at)
                    sequence.versions.append((done, weight_version))
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join(30)
        self._write_stats()

    # --- modelled time ------------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        """Move every GPU's clock from the last event to `now`."""
        running = self.running > 0
        decode_from = np.maximum(np.maximum(self.prefill_until, self.sync_until), self.last)
        decoding = np.where(running, np.maximum(now - decode_from, 0.0), 0.0)
        self.clock += decoding / decode_step_s(self.model, self.context)
        self.decoding_s += decoding
        self.running_s += decoding * self.running
        if not self.waiting:  # free slots the worker gave nothing to (else the GPUs were full)
            self.unasked_slot_s += float((decoding * (self.model.max_running - self.running)).sum())
        self.last = now

    def _admit(self, now: float) -> None:
        model = self.model
        while self.waiting and self.running.min() < model.max_running:
            sequence = self.waiting.popleft()
            key = hashlib.blake2b(np.asarray(sequence.prompt, dtype=np.int64).tobytes(), digest_size=16).digest()
            gpu = self.prefilled.get(key, -1)
            if gpu < 0 or self.running[gpu] >= model.max_running:
                gpu = int(self.running.argmin())
                prefill = prefill_s(model, len(sequence.prompt))
                self.prefill_until[gpu] = max(self.prefill_until[gpu], now) + prefill
                self.prefill_busy_s[gpu] += prefill
            self.prefilled[key] = gpu
            self.prefilled.move_to_end(key)
            if len(self.prefilled) > PREFIX_CACHE_PROMPTS * model.inference_gpus:
                self.prefilled.popitem(last=False)
            sequence.gpu, sequence.started_at = gpu, self.clock[gpu]
            sequence.context = len(sequence.prompt) + sequence.length / 2  # its mean KV while it decodes
            sequence.versions = [(0, self.version)]
            self.running[gpu] += 1
            self.context[gpu] += sequence.context
            heapq.heappush(self.finishing[gpu], (sequence.started_at + sequence.length, next(self.order), sequence))
            self.next_finish[gpu] = self.finishing[gpu][0][0]

    def _finish(self) -> list[_Sequence]:
        done = []
        for gpu in np.nonzero(self.next_finish <= self.clock + 1e-9)[0]:
            heap = self.finishing[gpu]
            while heap and heap[0][0] <= self.clock[gpu] + 1e-9:
                sequence = heapq.heappop(heap)[2]
                self.running[gpu] -= 1
                self.context[gpu] -= sequence.context
                done.append(sequence)
            self.next_finish[gpu] = heap[0][0] if heap else np.inf
        return done

    def _next_event(self, now: float) -> float:
        running = self.running > 0
        if not running.any():
            return np.inf
        decode_from = np.maximum(np.maximum(self.prefill_until, self.sync_until), now)
        at = decode_from + (self.next_finish - self.clock) * decode_step_s(self.model, self.context)
        return float(at[running].min())

    def step(self, now: float) -> list[_Sequence]:
        """Bring the GPUs to `now`: the sequences that ended by then, and the waiting
        ones admitted where there is room (call with the lock held)."""
        self._advance(now)
        done = self._finish()
        self._admit(now)
        return done

    def _serve(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                done = self.step(now)
                if self.closed:
                    break
                if not done:
                    wait = min(self._next_event(now), self.stats_at + self.stats_every_s) - now
                    self.cond.wait(max(wait, 0.0))
            for sequence in done:  # built outside the lock: the GPUs' time does not wait for Python
                sequence.future.set_result(self._completion(sequence))
                self.served += 1
            if now >= self.stats_at + self.stats_every_s:
                self.stats_at = now
                self._write_stats()
        for sequence in list(self.waiting) + [s for heap in self.finishing for _, _, s in heap]:
            sequence.future.set_exception(RuntimeError("the modelled GPUs were closed"))

    def _completion(self, sequence: _Sequence) -> Completion:
        params, length = sequence.params, sequence.length
        ids = self.vocab[self.rng.integers(0, len(self.vocab), length)]
        stop = params.stop_token_ids[:1] or (self.tokenizer.eos_token_id,)
        finished = length < params.max_new_tokens and stop[0] is not None
        if finished:
            ids[-1] = stop[0]
        start = int(self.rng.integers(0, len(self.text) - TEXT_CHARS_PER_TOKEN * length - 1))
        versions = token_versions(sequence.versions, length)
        return Completion(
            prompt_token_ids=sequence.prompt,
            response_token_ids=ids.tolist(),
            response_text=self.text[start : start + TEXT_CHARS_PER_TOKEN * length],
            logprobs=(-self.rng.exponential(1.0, length)).astype(np.float32).tolist(),
            finish_reason="stop" if finished else "length",
            weight_version=sequence.versions[0][1],
            token_versions=versions if len(set(versions)) > 1 else [],
        )

    def _write_stats(self) -> None:
        """A line of running totals (seconds the GPUs were busy, in all) at a wall-clock
        time, for the bench to take the busy fraction of any window."""
        if self.stats_path is None:
            return
        stats = {
            "time": time.time(),
            "gpus": self.model.inference_gpus,
            "decoding_s": float(self.decoding_s.sum()),
            "prefill_s": float(self.prefill_busy_s.sum()),
            "running_s": float(self.running_s.sum()),
            "unasked_slot_s": self.unasked_slot_s,
            "sync_pauses": self.sync_pauses,
            "served": self.served,
        }
        self.stats_path.parent.mkdir(parents=True, exist_ok=True)
        with self.stats_path.open("a") as out:
            out.write(json.dumps(stats) + "\n")


@register_inference_backend("modelled", in_recipes=False)
def modelled_backend(recipe, seed: int, settings=None, logs: Path | None = None) -> ModelledGpus:
    """Only under the cluster twin (STREAMRL_CLUSTER_TWIN): the recipe's tokenizer, GPUs in time."""
    model = twin_from_env()
    if model is None:
        raise ValueError("the modelled inference backend runs only under bench/cluster_twin.py (STREAMRL_CLUSTER_TWIN)")
    from transformers import AutoTokenizer  # here: `run`'s recipe check imports this module, not transformers

    tokenizer = AutoTokenizer.from_pretrained(recipe.rollout_worker.model_path)
    stats = logs / f"engine-twin-{seed}.jsonl" if logs is not None else None  # one a worker: seeds differ
    log.warning("cluster twin: %d modelled inference GPUs (%s), no model is run", model.inference_gpus, model.to_env())
    return ModelledGpus(model, tokenizer, seed, stats)
