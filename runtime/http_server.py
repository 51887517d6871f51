"""How StreamRL's HTTP servers (`streamrl ui`, `streamrl serve-training`) run uvicorn:
with deadlines on what a client sends, so that connections which send a request slowly,
or half of one, are closed instead of held for ever (uvicorn alone closes only idle
keep-alive connections).

A request's head must arrive within HEAD_S of its first byte's chance (the connection's
start, or the previous response's end); its body within BODY_S of its head, with no
pause longer than BODY_IDLE_S. A request that has arrived whole is never cut: the
deadlines bound the client's sending, not the server's answering.
"""

from __future__ import annotations

import asyncio

import h11
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_S = 10.0
BODY_S = 300.0  # a 64 MiB upload at about 220 KB/s
BODY_IDLE_S = 15.0


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines above."""

    deadline: asyncio.TimerHandle | None = None
    body_until: float | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm(HEAD_S)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            now = self.loop.time()
            if self.body_until is None:
                self.body_until = now + BODY_S
            self._arm(min(BODY_IDLE_S, self.body_until - now))
        elif state is not h11.IDLE:  # the request is whole (or the connection is ending)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.body_until = None
        if self.conn.their_state is h11.IDLE:  # waiting for the next request's head
            self._arm(HEAD_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(max(seconds, 0.0), self._expired)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        self.deadline = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()


class QuietDisconnects:
    """ASGI middleware: a request whose client went away before its body arrived (it gave
    up waiting, or a deadline above closed it) ends without a word. Starlette raises
    ClientDisconnect from the route's body read, before the route did anything; uvicorn
    would print it as an error with its whole traceback, once per such request."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            pass


def serve(app, host: str, port: int) -> None:
    """Run `app` with uvicorn on (host, port), warnings only, under the deadlines above."""
    import uvicorn

    uvicorn.run(QuietDisconnects(app), host=host, port=port, log_level="warning", http=DeadlineH11Protocol)
