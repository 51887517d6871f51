"""The training service's limits: every size a client chooses is bounded before anything
is allocated, recorded or run (`streamrl serve-training --limit NAME=VALUE`).

A request over a limit is refused with 413 (too large) or 429 (too many in flight)
naming the limit and the value, before `store.accept` records it, so a restarted
service never replays it.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import zstandard
from fastapi import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

MIB = 1 << 20


@dataclass(frozen=True)
class ServiceLimits:
    max_body_bytes: int = 64 * MIB  # a request's body, as sent
    # a zstd body, decompressed (streamed; the declared size is not trusted): a request at
    # max_tokens_per_request with every loss input takes about 25 MiB
    max_decompressed_bytes: int = 64 * MIB
    max_tokens_per_datum: int = 131_072  # one forward_backward datum's input
    max_tokens_per_request: int = 1_048_576  # all the data of one forward_backward
    max_sample_sequences: int = 128  # num_samples of one sample request
    max_sample_tokens: int = 262_144  # num_samples x (prompt + max_tokens) of one sample request
    max_new_tokens: int = 16_384  # max_tokens of one sample request: one request holds the shared sampler
    max_sample_seconds: int = 600  # one sample request's time on the shared sampler (then it fails, saying so)
    max_models_per_key: int = 32  # training models an API key may create
    max_sessions_per_key: int = 1024  # sessions an API key may open
    max_pending_per_key: int = 256  # requests of one key accepted and not yet run
    max_polls_per_key: int = 272  # futures one key waits on at once (its pending requests, and a few)

    @classmethod
    def from_pairs(cls, pairs: list[str]) -> ServiceLimits:
        """`NAME=VALUE` pairs over the defaults; an unknown name or a bad value is a ValueError."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for pair in pairs:
            name, sep, value = pair.partition("=")
            if not sep or name not in known:
                raise ValueError(f"--limit {pair!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(known))}")
            try:
                values[name] = int(value)
            except ValueError:
                raise ValueError(f"--limit {name}: {value!r} is not a whole number") from None
            if values[name] < 1:
                raise ValueError(f"--limit {name}: must be at least 1")
        return cls(**values)


def too_large(what: str, value: int, limit: str, bound: int) -> HTTPException:
    return HTTPException(413, f"{what}: {value} is over the service's {limit} ({bound})")


def decompress_capped(body: bytes, cap: int) -> bytes:
    """A zstd body decompressed in chunks, refused (413) once past `cap` bytes: a small
    body declaring gigabytes never gets them allocated. A corrupt frame is a 400."""
    out = io.BytesIO()
    try:
        declared = zstandard.frame_content_size(body)
        if declared > cap:  # -1: not declared; then counted as it is decompressed
            raise too_large("the decompressed body (as its frame declares)", declared, "max_decompressed_bytes", cap)
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
            while chunk := reader.read(1 << 20):
                if out.tell() + len(chunk) > cap:
                    raise too_large("the decompressed body", out.tell() + len(chunk), "max_decompressed_bytes", cap)
                out.write(chunk)
    except zstandard.ZstdError as error:
        raise HTTPException(400, f"the body is not valid zstd ({error})") from None
    return out.getvalue()


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` (by its Content-Length, or counted as it
    arrives when chunked) is answered 413 before a route reads it whole."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(send, int(declared) if declared.isdigit() else None)
        seen = 0

        async def counted() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise BodyTooLarge(seen)
            return message

        try:
            await self.app(scope, counted, send)
        except BodyTooLarge as error:
            await self._refuse(send, error.args[0])

    async def _refuse(self, send: Send, size: int | None) -> None:
        detail = (
            f"the request body: {size} bytes is over the service's max_body_bytes ({self.max_bytes})"
            if size is not None
            else "the request body: Content-Length is not a number"
        )
        body = (f'{{"detail": "{detail}"}}').encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413 if size is not None else 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    pass
