"""The worker of `streamrl serve-training`: runs accepted requests, each model's in its
sequence order, and records every outcome.

A model's requests run strictly by `seq_id` (the client numbers them per model), so
chunks sent concurrently still accumulate in order and a resubmitted request (same
id) cannot run twice. Every optimizer step ends with the model's durable state (trained
weights + optimizer) written and, in one transaction, the step's result and the model's
`applied_seq`; a restarted service loads that state and runs again only the requests
after it: their gradients were in memory, their results are kept. So each optimizer
step is applied exactly once, whenever the service is killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path

import torch

from streamrl.training_service.model import TrainableModel
from streamrl.training_service.names import CHECKPOINT_NAME
from streamrl.training_service.sampler import Sampler
from streamrl.training_service.store import ServiceStore
from streamrl.training_service.wire import (
    WireError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)

log = logging.getLogger("streamrl.serve_training")
OPEN_CHECK_S = 1.0
FINISHED_KEPT = 10_000
TRAINING_KINDS = ("create_model", "load_weights", "forward_backward", "optim_step", "save_weights", "save_weights_for_sampler")


def interleaved_by_key(rows: list[dict]) -> list[dict]:
    """Sample requests (`sample-KEY-HEX`) in turns of their keys, each key's in order."""
    queues: dict[str, list[dict]] = {}
    for row in rows:
        queues.setdefault(row["request_id"].removeprefix("sample-").rsplit("-", 1)[0], []).append(row)
    ordered = []
    while any(queues.values()):
        ordered += [queue.pop(0) for queue in queues.values() if queue]
    return ordered


# an absolute path: a slash that follows no word character, colon, dot or slash (so
# `tinker://model/weights/name`, `a/b` and `1/2` stay as they are)
ABSOLUTE_PATH = re.compile(r"(?<![\w:/.])/[^\s'\"(),;]+")


def without_paths(text: str) -> str:
    """An error for a client: the server's own paths (its folders, its models' files)
    are not the caller's to know; the service's log keeps the whole text."""
    return ABSOLUTE_PATH.sub("<server path>", text)


def folder_name(model_id: str) -> str:
    return model_id.replace(":", "_").replace("/", "_")


class Executor:
    def __init__(
        self, store: ServiceStore, root: Path, base_models: dict[str, str], device: torch.device, max_sample_seconds: int = 600
    ):
        self.store, self.root, self.base_models, self.device = store, root, base_models, device
        self.models: dict[str, TrainableModel] = {}
        self.next_seq: dict[str, int] = {}
        self.sampler = Sampler(device, max_seconds=max_sample_seconds)
        self.wake, self.sample_wake, self.stop = threading.Event(), threading.Event(), threading.Event()
        self.finished = threading.Lock()
        self.finished_ids: OrderedDict[str, None] = OrderedDict()  # the last FINISHED_KEPT, for a late waiter
        self.waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self.threads: list[threading.Thread] = []
        self.checked_open = 0.0

    # --- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        rows = self.store.models_to_restore()
        missing = sorted({row["base_model"] for row in rows} - set(self.base_models))
        if missing:  # an open session cannot continue on a model this service does not hold
            raise ValueError(
                f"the ledger has open sessions on base models this service is not started with: "
                f"{', '.join(missing)}; add --model NAME=FOLDER for each (or finish those sessions)"
            )
        for row in rows:
            self.restore(row)
        for target in (self.training_loop, self.sampling_loop):
            thread = threading.Thread(target=target, daemon=True, name=target.__name__)
            thread.start()
            self.threads.append(thread)

    def restore(self, row: dict) -> None:
        """A model of an open session after a restart: from its durable state (then the
        requests after `applied_seq` run again), or, with none, from its first request."""
        model_id = row["model_id"]
        if row["state_path"]:
            self.models[model_id] = self.build(row)
            self.models[model_id].load_state(Path(row["state_path"]), with_optimizer=True)
            self.next_seq[model_id] = row["applied_seq"] + 1
            log.info("restored %s at request %d (%d optimizer steps)", model_id, row["applied_seq"], row["optim_steps"])
        else:
            self.next_seq[model_id] = 0

    def track(self, model_id: str) -> None:
        self.next_seq.setdefault(model_id, 0)
        self.notify()

    def release(self, session_id: str) -> None:
        """A finished session's models: no longer polled for requests, nor held in memory."""
        for model_id in [m for m in self.next_seq if m.startswith(session_id + ":")]:
            self.next_seq.pop(model_id, None)
            self.models.pop(model_id, None)

    def release_closed(self) -> None:
        """Models whose session was closed elsewhere (`streamrl training-key revoke` finishes
        the key's sessions from another process): checked at most once a second."""
        now = time.monotonic()
        if now - self.checked_open < OPEN_CHECK_S or not self.next_seq:
            return
        self.checked_open = now
        asked = list(self.next_seq)  # a model tracked while the store answers is not in the answer
        open_models = self.store.open_models(asked)
        for model_id in [m for m in asked if m not in open_models]:
            log.info("model %s: its session was closed (finished or its key revoked); released", model_id)
            self.next_seq.pop(model_id, None)
            self.models.pop(model_id, None)

    def notify(self) -> None:
        """A request was accepted: both loops look for work now rather than at their next tick."""
        self.wake.set()
        self.sample_wake.set()

    def build(self, row: dict) -> TrainableModel:
        return TrainableModel(self.base_models[row["base_model"]], row["lora"], row["seed"], self.device)

    async def wait(self, request_id: str, timeout: float) -> bool:
        """Whether the request finished within `timeout`: an event on the caller's loop,
        set from the executor's thread, so a long-poll holds no thread while it waits."""
        loop, event = asyncio.get_running_loop(), asyncio.Event()
        with self.finished:
            if request_id in self.finished_ids:
                return True
            self.waiters.setdefault(request_id, []).append((loop, event))
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with self.finished:
                waiting = self.waiters.get(request_id, [])
                if (loop, event) in waiting:
                    waiting.remove((loop, event))
                if not waiting:
                    self.waiters.pop(request_id, None)

    def _finished(self, request_id: str) -> None:
        with self.finished:
            self.finished_ids[request_id] = None
            while len(self.finished_ids) > FINISHED_KEPT:
                self.finished_ids.popitem(last=False)
            for loop, event in self.waiters.pop(request_id, []):
                loop.call_soon_threadsafe(event.set)

    # --- loops ----------------------------------------------------------------------------------
    def training_loop(self) -> None:
        """Round robin over the models, one request each per round: a model with a long
        queue (one tenant's) does not hold the others back until it is empty."""
        while not self.stop.is_set():
            self.wake.wait(0.05)
            self.wake.clear()
            self.release_closed()
            progressed = True
            while progressed and not self.stop.is_set():
                progressed = False
                for model_id in list(self.next_seq):  # a session may finish (release) meanwhile
                    if (seq := self.next_seq.get(model_id)) is None or (row := self.store.request_at(model_id, seq)) is None:
                        continue
                    self.run(row)
                    progressed = True
                    if model_id in self.next_seq:
                        self.next_seq[model_id] = seq + 1

    def sampling_loop(self) -> None:
        """Sampling has its own thread (it never waits behind training), and takes the
        keys' pending requests in turn, one of each key's per round."""
        while not self.stop.is_set():
            self.sample_wake.wait(0.05)
            self.sample_wake.clear()
            for row in interleaved_by_key(self.store.pending(("sample",))):
                self.run(row)

    def run(self, row: dict) -> None:
        request_id, kind = row["request_id"], row["kind"]
        replay = row["status"] != "pending"  # ran before a restart: rebuild its effect, keep its result
        if replay and kind in ("save_weights", "save_weights_for_sampler"):
            return
        try:
            result, fmt, model_update = getattr(self, "do_" + kind)(row)
        except Exception as error:  # the request fails, the service goes on
            user = isinstance(error, (WireError, ValueError, KeyError))
            log.warning("request %s (%s) failed: %s", request_id, kind, error if user else traceback.format_exc())
            if not replay:
                told = without_paths(f"{type(error).__name__}: {error}")
                self.store.finish(request_id, None, None, error=told, category="user" if user else "server")
            self._finished(request_id)
            return
        if replay:
            self.store.count_run(request_id)
        else:
            self.store.finish(request_id, result, fmt, model_update=model_update)
        self._finished(request_id)

    # --- the operations ---------------------------------------------------------------------------
    def _model(self, model_id: str) -> TrainableModel:
        if model_id not in self.models:
            raise ValueError(f"model {model_id} is not loaded (its creation failed)")
        return self.models[model_id]

    def model_row(self, model_id: str) -> dict:
        """The stored row of a model the request names (a request names only models it made)."""
        row = self.store.model(model_id)
        if row is None:
            raise ValueError(f"model {model_id} is not in this service's store")
        return row

    def do_create_model(self, row: dict):
        self.models[row["model_id"]] = self.build(self.model_row(row["model_id"]))
        return json.dumps({"model_id": row["model_id"], "type": "create_model"}).encode(), "json", None

    def do_load_weights(self, row: dict):
        payload = json.loads(row["payload"])
        checkpoint = self.store.checkpoint(payload["path"])
        if checkpoint is None or checkpoint["kind"] != "state":
            raise ValueError(f"path: {payload['path']} is not a saved state of this service")
        model_id = row["model_id"]
        if model_id not in self.models:  # a new training client loaded from the state
            self.models[model_id] = self.build(self.model_row(model_id))  # shaped as the state's model
        self.models[model_id].load_state(Path(checkpoint["folder"]), with_optimizer=bool(payload.get("optimizer")))
        return json.dumps({"path": payload["path"], "model_id": model_id, "type": "load_weights"}).encode(), "json", None

    def do_forward_backward(self, row: dict):
        request = decode_forward_backward(row["payload"])
        outputs, metrics = self._model(row["model_id"]).forward_backward(request)
        return encode_forward_backward_output(outputs, metrics), "proto", None

    def do_optim_step(self, row: dict):
        model_id, seq = row["model_id"], row["seq_id"]
        model = self._model(model_id)
        payload = json.loads(row["payload"])
        metrics = model.optim_step(payload.get("adam_params") or payload.get("optim_params") or {})
        durable = self.root / "models" / folder_name(model_id) / "durable" / f"seq-{seq:08d}"
        model.save_state(durable)
        for older in sorted(durable.parent.glob("seq-*"))[:-2]:  # the committed one and this one stay
            shutil.rmtree(older, ignore_errors=True)
        update = {"model_id": model_id, "applied_seq": seq, "optim_steps": model.optim_steps, "state_path": str(durable)}
        return json.dumps({"metrics": metrics}).encode(), "json", update

    def _save(self, row: dict, kind: str, name: str | None):
        model_id, seq = row["model_id"], row["seq_id"]
        name = name or f"seq-{seq:08d}"
        if not CHECKPOINT_NAME.fullmatch(name) or ".." in name:  # the route refused it; a replay may not skip that
            raise ValueError(f"path: {name[:80]!r} is not a checkpoint name")
        section = "weights" if kind == "state" else "sampler_weights"
        own = (self.root / "models" / folder_name(model_id) / section).resolve()
        folder = (own / name).resolve()
        if folder.parent != own:
            raise ValueError(f"path: {name[:80]!r} leaves the model's own folder")
        model = self._model(model_id)
        folder = model.save_state(folder) if kind == "state" else model.export_for_sampler(folder)
        path = f"tinker://{model_id}/{section}/{name}"
        size = sum(f.stat().st_size for f in folder.iterdir())
        self.store.add_checkpoint(path, model_id, kind, str(folder), seq, size)
        return path, folder

    def do_save_weights(self, row: dict):
        path, _ = self._save(row, "state", json.loads(row["payload"]).get("path"))
        return json.dumps({"path": path, "type": "save_weights"}).encode(), "json", None

    def do_save_weights_for_sampler(self, row: dict):
        payload = json.loads(row["payload"])
        path, folder = self._save(row, "sampler", payload.get("path"))
        answer = {"path": path, "type": "save_weights_for_sampler"}
        if payload.get("sampling_session_seq_id") is not None:  # save_weights_and_get_sampling_client
            session_id = row["model_id"].split(":")[0]
            sampling_session = f"{session_id}:sample:{payload['sampling_session_seq_id']}"
            self.store.add_sampling_session(sampling_session, str(folder), self.model_row(row["model_id"])["base_model"], path)
            answer["sampling_session_id"] = sampling_session
        return json.dumps(answer).encode(), "json", None

    def do_sample(self, row: dict):
        payload = json.loads(row["payload"])
        tokens = [t for chunk in payload["prompt"]["chunks"] for t in chunk.get("tokens", [])]
        sequences, prompt_lp = self.sampler.sample(
            payload["folder"],
            tokens,
            payload.get("num_samples", 1),
            payload.get("sampling_params") or {},
            bool(payload.get("prompt_logprobs")),
        )
        return encode_sample_response(sequences, prompt_lp), "proto", None
