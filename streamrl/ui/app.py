"""`streamrl ui`: a run browser over the ledger (FastAPI, Jinja2 templates, Plotly).

    /                         runs: status, lineage, last step
    /runs/RUN                 a run: config, lineage, curves (by step or weight version,
                              ?compare=OTHER overlays another run); a running run's
                              curves refresh themselves from /api/runs/RUN/figures
    /runs/RUN/rollouts        the rollout browser: by step, group or SQL filter, keyset pages
    /runs/RUN/rollouts/TRAJ   one trajectory: tokens with mask, logprob and advantage,
                              its evaluation, its sample, its turns
    /sql                      one read-only statement, with CSV download (/sql.csv)

Every read goes through the ledger's read-only role (runtime/sql.py), so the browser
can show anything and change nothing.
"""

from __future__ import annotations

import csv
import io
import json
import secrets
import tempfile
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from streamrl.report import config_highlights
from streamrl.runtime.sql import SqlFailed, SqlRefused, plain_value, readonly_rows, run_readonly
from streamrl.ui.charts import figures
from streamrl.ui.queries import PAGE, Ledger, SqlBusy
from streamrl.ui.tokens import token_views, turn_views

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
SQL_ROW_LIMIT = 1000  # rows shown on the page; the CSV has them all


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def make_app(
    readonly_url: str, allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS, token: str | None = None, port: int | None = None
) -> FastAPI:
    """The browser. It answers only requests whose Host is one of `allowed_hosts` (a page
    elsewhere cannot rebind its own name to this machine and read the ledger through the
    user's browser), and with `token`, only requests that carry it (`?token=`, then a
    cookie named for `port`; or `Authorization: Bearer`)."""
    app = FastAPI(title="StreamRL run browser", docs_url=None, redoc_url=None)
    app.state.ledger, app.state.readonly_url = Ledger(readonly_url), readonly_url
    app.add_exception_handler(SqlFailed, ledger_error)  # type: ignore[arg-type]  # called with a SqlFailed only
    app.include_router(router)
    if token:
        app.add_middleware(TokenAuth, token=token, cookie=f"streamrl_ui_token_{port or 'any'}")
    app.add_middleware(SameOriginOnly)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    return app


class SameOriginOnly(BaseHTTPMiddleware):
    """A browser says where a request comes from (`Sec-Fetch-Site`, a header no page can
    set): a page of another origin (another site, or another port of this host) that
    loads `/sql?q=...pg_sleep...` as an image to time it is refused before any query
    runs. Navigation typed or bookmarked (`none`) and the browser's own pages
    (`same-origin`) pass; clients that send no such header (curl, scripts) are not browsers."""

    async def dispatch(self, request: Request, call_next):
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return Response(
                f"refused: a request from another site or port (Sec-Fetch-Site: {site})\n", 403, media_type="text/plain"
            )
        return await call_next(request)


class TokenAuth(BaseHTTPMiddleware):
    """Jupyter's scheme: the token printed at start, once in the URL, then a cookie."""

    def __init__(self, app, token: str, cookie: str):
        super().__init__(app)
        self.token, self.cookie = token, cookie

    async def dispatch(self, request: Request, call_next):
        given = (
            request.query_params.get("token")
            or request.cookies.get(self.cookie)
            or request.headers.get("authorization", "").removeprefix("Bearer ")
        )
        if not secrets.compare_digest(given or "", self.token):
            return Response("a token is required: open the URL `streamrl ui` printed\n", status_code=401, media_type="text/plain")
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict")
        return response


router = APIRouter()


def ledger_of(request: Request) -> Ledger:
    """The app's ledger (its read-only role), for a route to depend on."""
    return request.app.state.ledger


def page(request: Request, template: str, status_code: int = 200, **context) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, template, context, status_code=status_code)


def not_found(request: Request, what: str) -> HTMLResponse:
    return page(request, "message.html", 404, title="not found", message=what)


async def ledger_error(request: Request, exc: SqlFailed):
    if isinstance(exc, SqlBusy):
        return page(request, "message.html", 503, title="the ledger is busy", message=str(exc))
    return page(request, "message.html", 400, title="the ledger refused the query", message=str(exc))


@router.get("/static/plotly.min.js")
def plotly_js() -> Response:
    from plotly.offline import get_plotlyjs

    return Response(get_plotlyjs(), media_type="application/javascript", headers={"Cache-Control": "max-age=86400"})


@router.get("/", response_class=HTMLResponse)
def runs(
    request: Request,
    offset: int = Query(0, ge=0),
    tag: str | None = Query(None, max_length=200),
    ledger: Ledger = Depends(ledger_of),
):
    tag = tag or None  # the filter box sent empty: every run
    return page(request, "runs.html", runs=ledger.runs(100, offset, tag), offset=offset, tag=tag)


def run_figures(ledger: Ledger, run_id: str, compare: str | None, axis: str) -> tuple[dict[str, str], int]:
    """The figures, and the run's own step count (read once, with its curves)."""
    shown = [run_id] + ([compare] if compare and compare != run_id else [])
    data = [(r, ledger.curves(r), ledger.validation(r)) for r in shown]
    return figures(data, axis), len(data[0][1].rows)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run(
    request: Request,
    run_id: str,
    compare: str | None = None,
    x: str = Query("step", pattern="^(step|version)$"),
    refresh: float = Query(5.0, ge=0.5, le=3600.0),
    ledger: Ledger = Depends(ledger_of),
):
    found = ledger.run(run_id)
    if found is None:
        return not_found(request, f"run {run_id} is not in the ledger")
    if compare and ledger.run(compare) is None:
        return not_found(request, f"run {compare} (compare) is not in the ledger")
    shown, steps = run_figures(ledger, run_id, compare, x)
    return page(
        request,
        "run.html",
        run=found,
        highlights=config_highlights(found["config"] or {}, found["parent_run_id"]),
        figures=shown,
        compare=compare or "",
        axis=x,
        refresh_ms=int(refresh * 1000),
        steps=steps,
        others=[r["run_id"] for r in ledger.runs(200) if r["run_id"] != run_id],
    )


@router.get("/api/runs/{run_id}/figures")
def run_figures_json(
    run_id: str,
    compare: str | None = None,
    x: str = Query("step", pattern="^(step|version)$"),
    ledger: Ledger = Depends(ledger_of),
):
    found = ledger.run(run_id)
    if found is None:
        return JSONResponse({"error": f"run {run_id} is not in the ledger"}, status_code=404)
    shown, _ = run_figures(ledger, run_id, compare, x)
    return {"status": found["status"], "figures": {name: json.loads(figure) for name, figure in shown.items()}}


@router.get("/runs/{run_id}/rollouts", response_class=HTMLResponse)
def rollouts(
    request: Request,
    run_id: str,
    step: str | None = None,
    group: str | None = None,
    where: str | None = None,
    after: int = 0,
    ledger: Ledger = Depends(ledger_of),
):
    found = ledger.run(run_id)
    if found is None:
        return not_found(request, f"run {run_id} is not in the ledger")
    error, rows = None, []
    step_number = int(step) if step and step.strip().isdigit() else None
    if step not in (None, "") and step_number is None:  # said beside the form, as a bad filter is
        error = f"step: expected a step number, got {step[:40]!r}"
    else:
        try:
            rows = ledger.rollouts(run_id, step_number, group or None, where or None, after)
        except (SqlFailed, SqlRefused) as exc:  # a bad filter is shown beside the form
            error = str(exc)
    return page(
        request,
        "rollouts.html",
        run=found,
        rows=rows,
        step=step or "",
        group=group or "",
        where=where or "",
        error=error,
        next_after=rows[-1]["id"] if len(rows) == PAGE else None,
    )


@router.get("/runs/{run_id}/rollouts/{trajectory_id}", response_class=HTMLResponse)
def trajectory(request: Request, run_id: str, trajectory_id: str, ledger: Ledger = Depends(ledger_of)):
    found = ledger.run(run_id)
    if found is None:
        return not_found(request, f"run {run_id} is not in the ledger")
    item, evaluation, sample = ledger.trajectory(run_id, trajectory_id)
    if item is None:
        return not_found(request, f"trajectory {trajectory_id} is not in run {run_id}")
    model_path = ((found["config"] or {}).get("rollout_worker") or {}).get("model_path")
    tokens = token_views(item, sample, model_path)
    return page(
        request,
        "trajectory.html",
        run=found,
        item=item,
        evaluation=evaluation,
        sample=sample,
        turns=turn_views(item, tokens),
        trained=sum(t.trained for t in tokens),
        total=len(tokens),
    )


SQL_PAGE_BYTES = 16 * 2**20  # what the SQL box holds of a result at most, roughly
SQL_PAGE_VALUE_CHARS = 65_536  # a longer value is cut on the page (the CSV has it whole)
CSV_VALUE_CHARS = 16 * 2**20  # a CSV value longer than this is refused: select part of it
CSV_MAX_BYTES = 2**30


def sql_result(request: Request, query: str):
    try:
        with ledger_of(request).reader():
            result = run_readonly(
                request.app.state.readonly_url,
                query,
                max_rows=SQL_ROW_LIMIT,
                max_bytes=SQL_PAGE_BYTES,
                max_value_chars=SQL_PAGE_VALUE_CHARS,
            )
        return result, None
    except (SqlRefused, SqlFailed) as exc:
        return None, str(exc)


@router.get("/sql", response_class=HTMLResponse)
def sql(request: Request, q: str = ""):
    result, error = sql_result(request, q) if q.strip() else (None, None)
    rows = [[plain_value(v) for v in row] for row in result.rows] if result else []
    return page(
        request, "sql.html", status_code=400 if error else 200, q=q, result=result, rows=rows, error=error, limit=SQL_ROW_LIMIT
    )


def spooled_csv(readonly_url: str, query: str):
    """The whole result as CSV in a temporary file (memory up to 1 MiB, then disk), read
    within the query's time limit, so the ledger's connection is closed before the
    client reads a byte, however slowly it reads or if it never does."""
    spool = tempfile.SpooledTemporaryFile(max_size=2**20)
    text = io.TextIOWrapper(spool, encoding="utf-8", newline="")
    writer = csv.writer(text)
    with readonly_rows(readonly_url, query, max_value_chars=CSV_VALUE_CHARS) as (columns, rows):
        writer.writerow(columns)
        for number, row in enumerate(rows, start=1):
            for column, value in zip(columns, row):
                if value is not None and len(value) > CSV_VALUE_CHARS:
                    raise SqlFailed(
                        f"row {number}, column {column}: a value over {CSV_VALUE_CHARS:,} characters; select part of it"
                    )
            writer.writerow(row)
            if spool.tell() > CSV_MAX_BYTES:
                raise SqlFailed(f"the CSV is over {CSV_MAX_BYTES:,} bytes at row {number}; select fewer rows or columns")
    text.flush()
    text.detach()
    spool.seek(0)
    return spool


@router.get("/sql.csv")
def sql_csv(request: Request, q: str):
    """Every row (each value as PostgreSQL writes it as text), from a server-side cursor
    into a spooled file, then sent."""
    try:
        with ledger_of(request).reader():
            spool = spooled_csv(request.app.state.readonly_url, q)
    except (SqlRefused, SqlFailed) as exc:
        return Response(str(exc) + "\n", status_code=503 if isinstance(exc, SqlBusy) else 400, media_type="text/plain")

    def chunks():
        with spool:
            while chunk := spool.read(2**16):
                yield chunk

    return StreamingResponse(
        chunks(),
        media_type="text/csv",
        headers={"Content-Disposition": 'attachment; filename="streamrl-query.csv"'},
    )
