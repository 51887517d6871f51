"""Who is calling the training service, and what they may touch: the API key behind a
request (re-checked every few seconds, so a revoked key stops working), the sessions
and models it owns, and request bodies parsed into the client's own types."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pydantic
from fastapi import Header, HTTPException, Request

from streamrl.training_service.executor import Executor
from streamrl.training_service.limits import ServiceLimits
from streamrl.training_service.store import ServiceStore

KEY_RECHECK_S = 5.0


@dataclass
class Access:
    store: ServiceStore
    known_keys: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (key id, when checked)
    owners: dict[str, str | None] = field(default_factory=dict)  # session -> its key id (never changes)

    def key_id(self, api_key: str | None) -> str:
        if not api_key:
            raise HTTPException(401, "an API key is required (X-API-Key; `streamrl training-key create NAME`)")
        known = self.known_keys.get(api_key)
        if known is None or time.monotonic() - known[1] > KEY_RECHECK_S:
            key_id = self.store.key_id_for(api_key)
            if key_id is None:
                self.known_keys.pop(api_key, None)
                raise HTTPException(401, "the API key is not valid")
            known = self.known_keys[api_key] = (key_id, time.monotonic())
        return known[0]

    def owner(self, session_id: str) -> str | None:
        if session_id not in self.owners:
            self.owners[session_id] = self.store.session_key(session_id)
        return self.owners[session_id]

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
