"""Rollouts from SGLang servers: token ids in, token ids and behaviour logprobs out.

`SGLangEngine.complete(prompt_ids, params)` posts `/generate` with `input_ids` and
`return_logprob: true` and returns the server's own output ids and
`meta_info.output_token_logprobs`: no text crosses the training path. Every answer
carries the server's `meta_info.weight_version`; one that differs from the version the
worker loaded (a server that restarted and came back with its base weights) is
discarded, the server re-synced, and the request sent again.

Weight sync (`update_weights`) closes a gate (new requests wait), aborts the requests in
flight (there are none in `sync` and `batch-async`: the worker updates between batches),
loads the version on every server (from the learner's broadcast with `weight.transport:
distributed`, producers/sglang_broadcast.py, else or failing that with
`/update_weights_from_disk`), checks that each reports it, and opens the gate. An aborted request comes back with
the tokens it had sampled: with `partial_rollout: resume` they are kept and generation continues from
them under the new weights, each token keeping the version that sampled it; with
`redo` they are dropped and the completion starts again.

A server that stops answering: a managed one is restarted and re-synced; an external
one is retried with exponential backoff, `max_retries` times, then the worker stops
with one sentence naming the URL.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from streamrl.producers.inference import Completion, SamplingParams, register_inference_backend
from streamrl.producers.sglang_adapters import ADAPTER_ROUTES, adapter_name, load_adapter, lora_server_args
from streamrl.producers.sglang_broadcast import receive_broadcast
from streamrl.producers.sglang_server import InferenceServerError, ManagedServer
from streamrl.runtime.backoff import backoff_delay
from streamrl.runtime.recipe import server_urls
from streamrl.runtime.weight_transport import adapter_versions, ranks_per_server
from streamrl.schema.events import WeightBroadcast

log = logging.getLogger("streamrl.sglang")
ABORTED = "abort"
WEIGHT_ROUTES = (
    "/update_weights_from_disk",
    "/begin_weight_update",
    "/init_weights_update_group",
    "/update_weights_from_distributed",
    "/destroy_weights_update_group",
    "/end_weight_update",
    *ADAPTER_ROUTES,
)


@dataclass
class Server:
    url: str
    managed: ManagedServer | None = None
    epoch: int = 0  # bumped on each restart or re-sync, so one failure is repaired once
    lock: threading.RLock = field(default_factory=threading.RLock)  # held while repairing or loading
    slots: threading.Semaphore | None = None
    adapter: str | None = None  # the LoRA adapter it serves (trainer.lora.versions: adapter)


@dataclass
class Generated:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: str
    message: str = ""  # why the server aborted it, when it did


def parse_generate(body: dict) -> Generated:
    """The part of an SGLang `/generate` answer StreamRL trains on."""
    meta = body["meta_info"]
    ids = [int(t) for t in body["output_ids"]]
    logprobs = [float(entry[0]) for entry in meta.get("output_token_logprobs") or []]
    if len(logprobs) != len(ids):
        raise InferenceServerError(f"the server returned {len(ids)} output ids but {len(logprobs)} logprobs")
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type", "length") if isinstance(reason, dict) else str(reason)
    message = str(reason.get("message", "")) if isinstance(reason, dict) else ""
    return Generated(ids, logprobs, kind, str(meta.get("weight_version", "")), message)


class SGLangEngine:
    """The engine front a worker's InferenceClient drives, over one or more servers."""

    def __init__(
        self,
        servers: list[Server],
        tokenizer,
        partial_rollout: str = "resume",
        request_timeout_s: float = 600.0,
        sync_timeout_s: float = 300.0,
        max_retries: int = 3,
        api_key: str | None = None,
        ranks_per_server: int = 1,
        adapters: bool = False,
    ):
        self.servers = servers
        self.tokenizer = tokenizer
        self.partial_rollout = partial_rollout
        self.sync_timeout_s = sync_timeout_s
        self.max_retries = max_retries
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._request_timeout_s = request_timeout_s
        self._clients = threading.local()
        self._all_clients: list[httpx.Client] = []
        self.version: int | None = None  # what every server holds (None: not synced yet)
        self.version_path: str | None = None
        self._folder_follows = False  # the current version was broadcast: its folder may not be written yet
        self._gate = threading.Condition()
        self._updating = False
        self._in_flight = 0
        self._updates = 0
        self._update_lock = threading.RLock()
        self._next = itertools.count()
        self.aborted_requests = 0
        self.broadcast_fallbacks = 0  # versions that did not arrive by broadcast and were loaded from disk
        self.ranks_per_server = ranks_per_server
        self.adapters = adapters  # versions are LoRA adapters (producers/sglang_adapters.py)
        self.sync_seconds: list[float] = []

    # --- generation ---------------------------------------------------------------------------
    def complete(self, prompt: list[int], params: SamplingParams) -> Completion:
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = "length"
        while len(tokens) < params.max_new_tokens:
            server, version, updates = self._admit()
            try:
                out = self._generate(server, list(prompt) + tokens, params, params.max_new_tokens - len(tokens))
            finally:
                self._release()
            if out is None:  # the server serves another version (it restarted): reload, then resend
                self._refresh(updates)
                continue
            if out.finish_reason == ABORTED:
                with self._gate:
                    if self._updates == updates and not self._updating:  # not by us: the server refused it
                        raise ValueError(f"the inference server aborted the request: {out.message or 'no reason given'}")
                    self.aborted_requests += 1  # paused for a weight update
                if self.partial_rollout == "redo":
                    tokens, logprobs, versions = [], [], []
                    continue
            tokens += out.token_ids
            logprobs += out.logprobs
            versions += [version if version is not None else 0] * len(out.token_ids)
            if out.finish_reason != ABORTED:
                finish = "stop" if out.finish_reason == "stop" else "length"
                break
        return Completion(
            prompt_token_ids=list(prompt),
            response_token_ids=tokens,
            response_text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            logprobs=logprobs,
            finish_reason=finish,
            weight_version=min(versions) if versions else (self.version or 0),
            token_versions=versions if len(set(versions)) > 1 else [],
        )

    def _admit(self) -> tuple[Server, int | None, int]:
        """A server for one request, once no update is under way: (server, the version it
        serves, how many updates there have been)."""
        with self._gate:
            while self._updating:
                self._gate.wait()
            self._in_flight += 1
            version, updates = self.version, self._updates
        return self.servers[next(self._next) % len(self.servers)], version, updates

    def _release(self) -> None:
        with self._gate:
            self._in_flight -= 1
            self._gate.notify_all()

    def _generate(self, server: Server, input_ids: list[int], params: SamplingParams, max_new_tokens: int) -> Generated | None:
        sampling: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": params.temperature, "top_p": params.top_p}
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            # SGLang draws from it only on a server started with
            # --enable-deterministic-inference (docs/anatomy.md, "Why the two agree exactly")
            sampling["sampling_seed"] = params.seed
        payload = {"input_ids": input_ids, "sampling_params": sampling, "return_logprob": True}
        if self.adapters and self.version is not None:
            payload["lora_path"] = adapter_name(self.version)
        body = self._post(server, "/generate", payload)
        out = parse_generate(body)
        expected = self.version
        if expected is not None and out.weight_version != str(expected):
            log.warning("%s answered with weight version %r, not %d: re-syncing it", server.url, out.weight_version, expected)
            return None
        return out

    def _refresh(self, seen_updates: int) -> None:
        """Load the current version again on every server, through the gate like any
        update (once, however many requests saw the stale answer)."""
        with self._update_lock:
            if self._updates == seen_updates and self.version_path is not None:
                self.update_weights(*self.synced())

    # --- talking to a server, and repairing it --------------------------------------------------
    @property
    def http(self) -> httpx.Client:
        """This thread's HTTP client. One per thread, replaced after a transport error: a
        client's connection pool shared by many threads can be left waiting for a
        connection that failed under load (encode/httpcore#550), and a rollout must not."""
        client = getattr(self._clients, "client", None)
        if client is None:
            # idle connections are dropped before the server's keep-alive timeout
            # (uvicorn: 5 s) can close one under a new request
            client = httpx.Client(
                timeout=httpx.Timeout(self._request_timeout_s, connect=10.0, pool=10.0),
                headers=self._headers,
                limits=httpx.Limits(keepalive_expiry=2.0),
            )
            self._clients.client = client
            self._all_clients.append(client)
        return client

    def _drop_client(self) -> None:
        client = getattr(self._clients, "client", None)
        if client is not None:
            self._clients.client = None
            client.close()

    def _post(self, server: Server, route: str, payload: dict, timeout: float | None = None) -> dict:
        attempt = 0
        while True:
            epoch = server.epoch
            try:
                with server.slots or contextlib.nullcontext():
                    response = self.http.post(server.url + route, json=payload, timeout=timeout or httpx.USE_CLIENT_DEFAULT)
            except httpx.TransportError as exc:
                self._drop_client()
                attempt += 1
                self._repair(server, epoch, attempt, exc)
                continue
            if response.status_code >= 500 and server.managed is not None and not server.managed.alive():
                attempt += 1
                self._repair(server, epoch, attempt, RuntimeError(f"HTTP {response.status_code}"))
                continue
            if response.status_code == 400 and route in WEIGHT_ROUTES:
                return response.json()  # a refused version: the caller says which and why
            if 400 <= response.status_code < 500 and route == "/generate":
                # this request's fault (too long for the context, ...): its rollout fails, the worker goes on
                raise ValueError(f"the inference server refused the request: {response.text[:300]}")
            if response.status_code != 200:
                raise InferenceServerError(f"{server.url}{route} answered HTTP {response.status_code}: {response.text[:300]}")
            return response.json() if response.content else {}

    def _repair(self, server: Server, epoch: int, attempt: int, error: Exception) -> None:
        """After a failed request: restart a dead managed server (and re-sync it), or wait
        for an external one with exponential backoff; give up after max_retries."""
        with server.lock:
            if server.epoch != epoch:  # another request already repaired it
                return
            if server.managed is not None and not server.managed.alive():
                log.warning("the SGLang server %s died (%s): restarting it", server.url, error)
                if server.managed.restarts >= self.max_retries:
                    raise InferenceServerError(
                        f"the managed SGLang server {server.url} died "
                        f"{server.managed.restarts + 1} times; its log ends:\n"
                        f"{server.managed.log_tail()}"
                    )
                server.managed.restart()
                server.epoch += 1
                self._load(server)
                return
            if attempt > self.max_retries:
                raise InferenceServerError(
                    f"inference server {server.url} did not answer after {attempt} tries ({type(error).__name__}: {error})"
                )
            if attempt == 1 and isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
                return  # a connection the server had just closed: try again at once
            delay = backoff_delay(attempt, 1.0, 30.0)
            log.warning(
                "inference server %s did not answer (%s); retry %d/%d in %.0f s",
                server.url,
                error,
                attempt,
                self.max_retries,
                delay,
            )
            time.sleep(delay)

    # --- weights ----------------------------------------------------------------------------------
    def update_weights(self, model_path: str, weight_version: int, broadcast: WeightBroadcast | None = None) -> None:
        """Load `weight_version` on every server, verified, or raise InferenceServerError
        (the servers keep serving the version they had): from the learner's `broadcast`
        when there is one, else (or if it fails) from the folder `model_path`."""
        with self._update_lock:  # one update at a time
            self._update(model_path, weight_version, broadcast)

    def _update(self, model_path: str, weight_version: int, broadcast: WeightBroadcast | None) -> None:
        started = time.perf_counter()
        with self._gate:
            self._updating = True
            self._updates += 1
            in_flight = self._in_flight
        try:
            if in_flight:
                for server in self.servers:  # the aborted requests return what they sampled so far
                    self._post(server, "/abort_request", {"abort_all": True}, timeout=self.sync_timeout_s)
            with self._gate:
                if not self._gate.wait_for(lambda: self._in_flight == 0, timeout=self.sync_timeout_s):
                    raise InferenceServerError(
                        f"requests still in flight {self.sync_timeout_s:.0f} s after "
                        f"aborting them for weight version {weight_version}"
                    )
            previous = (self.version_path, self.version, self._folder_follows)
            self.version_path, self.version = str(model_path), weight_version
            self._folder_follows = broadcast is not None  # written after the broadcast
            try:
                if broadcast is None or not self._receive(broadcast):
                    for server in self.servers:
                        with server.lock:
                            server.epoch += 1
                            self._load(server)
            except InferenceServerError:
                self.version_path, self.version, self._folder_follows = previous
                raise
        finally:
            with self._gate:
                self._updating = False
                self._gate.notify_all()
        self.sync_seconds.append(time.perf_counter() - started)

    def _receive(self, broadcast: WeightBroadcast) -> bool:
        """The current version from the learner's broadcast, on every server, verified;
        False (logged) when it did not arrive, and the folder is to be loaded instead."""
        try:
            receive_broadcast(
                lambda url, route, payload: self._post(self._server(url), route, payload, timeout=self.sync_timeout_s),
                [server.url for server in self.servers],
                broadcast,
                self.synced()[1],
                self.ranks_per_server,
                lambda url: self._flush_cache(self._server(url)),
                self.sync_timeout_s,
            )
            for server in self.servers:
                self._check_serves(server)
            return True
        except InferenceServerError as exc:
            log.warning(
                "weight version %d did not arrive by broadcast (%s): loading its folder %s", self.version, exc, self.version_path
            )
            self.broadcast_fallbacks += 1
            return False

    def _server(self, url: str) -> Server:
        return next(server for server in self.servers if server.url == url)

    def _load(self, server: Server) -> None:
        """Load the engine's current version on `server` and check that it serves it."""
        if self.version_path is None:
            return
        if self._folder_follows:
            self._wait_for_folder()
        if self.adapters:
            server.adapter = load_adapter(
                lambda route, payload: self._post(server, route, payload, timeout=self.sync_timeout_s),
                server.url,
                self.synced()[1],
                self.version_path,
                server.adapter,
            )
            self._check_serves(server)
            return
        body = self._post(
            server,
            "/update_weights_from_disk",
            {"model_path": self.version_path, "weight_version": str(self.version)},
            timeout=self.sync_timeout_s,
        )
        if not body.get("success"):
            if "cache was not flushed" not in str(body.get("message")):
                raise InferenceServerError(
                    f"{server.url} refused weight version {self.version} from {self.version_path}: {body.get('message', body)}"
                )
            # Loaded, but aborted requests were still leaving the scheduler: the prefix cache
            # (KV of the old weights) must go before anything is served from it.
            self._flush_cache(server)
        self._check_serves(server)

    def synced(self) -> tuple[str, int]:
        """The version every server is to hold (its folder, its number): set by the first sync."""
        if self.version is None or self.version_path is None:
            raise RuntimeError("no weight version has been synced to the SGLang servers yet")
        return self.version_path, self.version

    def _wait_for_folder(self) -> None:
        """A broadcast version is announced before its folder is written (in the
        background, after the broadcast): wait for the folder."""
        deadline = time.monotonic() + self.sync_timeout_s
        while not Path(self.synced()[0]).is_dir():
            if time.monotonic() > deadline:
                raise InferenceServerError(
                    f"weight version {self.version}'s folder {self.version_path} did not "
                    f"appear within {self.sync_timeout_s:.0f} s"
                )
            time.sleep(0.2)

    def _check_serves(self, server: Server) -> None:
        probe = {"input_ids": [self.tokenizer.eos_token_id or 0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        served = str(self._post(server, "/generate", probe)["meta_info"].get("weight_version"))
        if served != str(self.version):
            raise InferenceServerError(f"{server.url} reports weight version {served!r} after loading version {self.version}")

    def _flush_cache(self, server: Server) -> None:
        response = self.http.post(
            f"{server.url}/flush_cache", params={"timeout": self.sync_timeout_s}, timeout=self.sync_timeout_s + 10
        )
        if response.status_code != 200:
            raise InferenceServerError(
                f"{server.url} loaded weight version {self.version} but could not flush "
                f"its cache within {self.sync_timeout_s:.0f} s: {response.text[:200]}"
            )

    def close(self) -> None:
        for client in self._all_clients:
            client.close()
        for server in self.servers:
            if server.managed is not None:
                server.managed.stop()


@register_inference_backend("sglang")
def sglang_backend(recipe, seed: int, settings, logs: Path) -> SGLangEngine:
    """SGLang servers: the recipe's `url`s, or `num_servers` managed ones launched from
    the recipe's model (stopped with the worker)."""
    from transformers import AutoTokenizer  # here: validating a recipe imports this module

    service, lora = recipe.service.inference_service, recipe.trainer.lora
    tokenizer = AutoTokenizer.from_pretrained(recipe.rollout_worker.model_path)
    slots = service.max_batch_size
    adapters = adapter_versions(lora)
    if service.url:
        servers = [Server(url, slots=threading.Semaphore(slots)) for url in server_urls(service.url)]
    else:
        server_args = {
            **({"api-key": service.api_key} if service.api_key else {}),
            "random-seed": seed,
            **(lora_server_args(lora, recipe.trainer.device) if adapters else {}),
            **service.server_args,
        }
        servers = []
        try:
            for index in range(service.num_servers):
                managed = ManagedServer(
                    settings.sglang_python,
                    recipe.rollout_worker.model_path,
                    recipe.trainer.device,
                    server_args,
                    logs / f"sglang-{seed}-{index}.log",
                    service.startup_timeout_s,
                )
                servers.append(Server(managed.start().url, managed=managed, slots=threading.Semaphore(slots)))
        except BaseException:
            for server in servers:
                if server.managed is not None:
                    server.managed.stop()
            raise
    return SGLangEngine(
        servers,
        tokenizer,
        partial_rollout=service.partial_rollout or "resume",
        request_timeout_s=service.request_timeout_s,
        sync_timeout_s=service.weight_sync_timeout_s,
        max_retries=service.max_retries,
        api_key=service.api_key,
        ranks_per_server=ranks_per_server(service.server_args),
        adapters=adapters,
    )
