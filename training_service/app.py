"""`streamrl serve-training`: StreamRL's learner behind the Tinker HTTP API.

The official `tinker` client talks to it unchanged (`tinker.ServiceClient(base_url=...)`):
sessions, LoRA or full fine-tuning models, forward_backward / optim_step /
save_state / load_state / save_weights_for_sampler / sample, all as futures. Requests
are recorded in PostgreSQL before they are answered (training_service/store.py) and run
by the executor (the routes: training_service/routes.py); `retrieve_future` long-polls for their outcome. Every endpoint but
`healthz` needs an API key (`X-API-Key`, created by `streamrl training-key create NAME`).
"""

from __future__ import annotations

import psycopg
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from streamrl.training_service.access import Access, Service
from streamrl.training_service.executor import Executor
from streamrl.training_service.limits import BodyLimit, ServiceLimits
from streamrl.training_service.routes import BODY_SCHEMAS, router, streamrl_router
from streamrl.training_service.store import ServiceStore
from streamrl.training_service.wire import WireError


def build_app(store: ServiceStore, executor: Executor, limits: ServiceLimits | None = None) -> FastAPI:
    limits = limits or ServiceLimits()
    app = FastAPI(title="StreamRL training service", docs_url=None, redoc_url=None)
    app.state.service = Service(store, executor, Access(store), limits)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.add_exception_handler(WireError, wire_error)  # type: ignore[arg-type]  # called with a WireError only
    app.add_exception_handler(psycopg.DataError, unstorable)
    app.add_exception_handler(sqlalchemy.exc.DataError, unstorable)  # the store's, wrapping psycopg's
    app.include_router(router)
    app.include_router(streamrl_router)
    generated = app.openapi

    def openapi_with_bodies() -> dict:
        document = generated()  # built once, then cached by FastAPI
        document.setdefault("components", {}).setdefault("schemas", {}).update(BODY_SCHEMAS)
        return document

    app.openapi = openapi_with_bodies  # type: ignore[method-assign]
    return app


def wire_error(request: Request, error: WireError):
    return JSONResponse({"detail": str(error)}, status_code=400)


def unstorable(request: Request, error: Exception):
    """A value PostgreSQL cannot hold (a NUL character, a number past its column) is the
    client's malformed input: a 400 naming it, never a 500."""
    cause = getattr(error, "orig", None) or error  # SQLAlchemy's error names the statement: psycopg's, the value
    return JSONResponse({"detail": f"a value in the request cannot be stored: {str(cause).splitlines()[0]}"}, status_code=400)
