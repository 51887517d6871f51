"""Who is calling the training service, and what they may touch: the API key behind a
request (looked up on every request, so a revoked key stops working at once), the
sessions and models it owns, and request bodies parsed into the client's own types."""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import pydantic
from fastapi import Header, HTTPException, Request

from streamrl.training_service.executor import Executor
from streamrl.training_service.limits import ServiceLimits
from streamrl.training_service.store import ServiceStore

OWNERS_KEPT = 4096  # sessions whose owner is remembered (the most recently asked)
DECODERS = 2  # uploads decompressed and parsed at once (each on a thread)
MAX_ID_CHARS = 200  # a session, model or request id longer than this names nothing here


@dataclass
class Access:
    store: ServiceStore
    owners: OrderedDict[str, str] = field(default_factory=OrderedDict)  # session -> its key id (never changes)

    def key_id(self, api_key: str | None) -> str:
        if not api_key:
            raise HTTPException(401, "an API key is required (X-API-Key; `streamrl training-key create NAME`)")
        key_id = self.store.key_id_for(api_key)
        if key_id is None:
            raise HTTPException(401, "the API key is not valid")
        return key_id

    def owner(self, session_id: str) -> str | None:
        """The session's key id, or None for a session that does not exist; only existing
        sessions are remembered, and only the last OWNERS_KEPT (unknown ids cost nothing)."""
        if len(session_id) > MAX_ID_CHARS:
            return None
        if session_id in self.owners:
            self.owners.move_to_end(session_id)
            return self.owners[session_id]
        key_id = self.store.session_key(session_id)
        if key_id is not None:
            self.owners[session_id] = key_id
            while len(self.owners) > OWNERS_KEPT:
                self.owners.popitem(last=False)
        return key_id

    def own_session(self, session_id: str, key_id: str) -> None:
        if self.owner(session_id) != key_id:
            raise HTTPException(404, f"session_id: no session {session_id!r} for this API key")

    def own_model(self, model_id: str, key_id: str) -> dict:
        """The model's row, or 404: "not yours" and "does not exist" are one answer, so a
        caller learns nothing of other keys' models."""
        row = self.store.model(model_id)
        if row is None or self.owner(row["session_id"]) != key_id:
            raise HTTPException(404, f"model_id: no model {model_id!r} for this API key")
        return row

    def own_sampling_session(self, sampling_session_id: str, key_id: str) -> None:
        """A sampling session is `SESSION:sample:N`: the caller must own SESSION (else 404)."""
        session_id = sampling_session_id.split(":sample:", 1)[0]
        if ":sample:" not in sampling_session_id or self.owner(session_id) != key_id:
            raise HTTPException(404, f"sampling_session_id: no session {sampling_session_id!r} for this API key")


@dataclass
class Service:
    """What every route works with (on `app.state.service`)."""

    store: ServiceStore
    executor: Executor
    access: Access
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    polls: dict[str, int] = field(default_factory=dict)  # key id -> its long-polls open now
    decoding: anyio.CapacityLimiter | None = None

    def decoders(self) -> anyio.CapacityLimiter:
        """The threads that decompress and parse uploads: DECODERS, made on first use (an
        anyio limiter belongs to the running event loop)."""
        if self.decoding is None:
            self.decoding = anyio.CapacityLimiter(DECODERS)
        return self.decoding

    def admit(self, key_id: str, new: str = "request") -> None:
        """429 when `key_id` is at its limit of `new` things (a session, a model, or a
        request waiting to run), before anything is recorded."""
        usage = self.store.key_usage(key_id)
        held, limit = {
            "session": ("sessions", self.limits.max_sessions_per_key),
            "model": ("models", self.limits.max_models_per_key),
        }.get(new, ("pending", 0))
        if new in ("session", "model") and usage[held] >= limit:
            raise HTTPException(429, f"this API key holds {usage[held]} {held}: the service's max_{held}_per_key is {limit}")
        if usage["pending"] >= self.limits.max_pending_per_key:
            raise HTTPException(
                429,
                f"this API key has {usage['pending']} requests waiting to run: the service's "
                f"max_pending_per_key is {self.limits.max_pending_per_key}; retry once they finish",
            )

    @contextmanager
    def long_poll(self, key_id: str):
        """One of the key's open long-polls (a future's wait), or 429 past
        max_polls_per_key: what a key may hold open is bounded by what it has live."""
        open_polls = self.polls.get(key_id, 0)
        if open_polls >= self.limits.max_polls_per_key:
            raise HTTPException(
                429,
                f"this API key has {open_polls} futures waiting: the service's max_polls_per_key "
                f"is {self.limits.max_polls_per_key}",
            )
        self.polls[key_id] = open_polls + 1
        try:
            yield
        finally:
            self.polls[key_id] -= 1
            if not self.polls[key_id]:
                del self.polls[key_id]

    def future(self, request_id: str, model_id: str | None = None, **extra) -> dict:
        """The API's answer to an accepted request; the executor is woken to run it."""
        self.executor.notify()
        return {"request_id": request_id, "model_id": model_id, **extra}


def service_of(request: Request) -> Service:
    return request.app.state.service


def caller(request: Request, x_api_key: str | None = Header(default=None)) -> str:
    """The calling API key's id (a route's dependency), or 401."""
    return service_of(request).access.key_id(x_api_key)


def parse(model: type[pydantic.BaseModel], body: bytes):
    """`body` as the client's request type, or a 400 naming the fields that are wrong."""
    if b"\\u0000" in body or b"\x00" in body:
        raise HTTPException(400, f"{model.__name__}: NUL characters are not accepted in a request")
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as error:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5])
        raise HTTPException(400, f"{model.__name__}: {fields}") from None
