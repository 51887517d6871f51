"""Read-only SQL over the ledger.

Four guards, strongest last: a friendly check of the statement's first keyword; the
query is sent as a prepared statement (or a server-side cursor's DECLARE, itself
prepared), which PostgreSQL refuses to build from more than one command; it runs in a
READ ONLY transaction with a statement timeout (and a watchdog outside the session that
cancels it at the same limit, for a server where the reader may still call `set_config`),
so even a write hidden in a CTE or an EXPLAIN ANALYZE cannot change the ledger; and the
commands connect as `streamrl_reader` (migrations 0007, 0013, 0014, 0017: SELECT on the
ledger and nothing else; no `set_config`, no signals to other sessions, temporary files
capped), so server files, other sessions and other roles are out of reach whatever the
query does.

Memory is bounded too: a SELECT-like statement's rows come from a server-side cursor in
batches of about 8 MiB, values can be cut by the server before they are sent
(`max_value_chars`), and the callers that hold a result stop at a row and a byte limit
(`run_readonly`) or stream it (`readonly_rows`).
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg

from streamrl.runtime.db import connect

READ_KEYWORDS = {"select", "with", "values", "table", "explain", "show"}
_LEADING_NOISE = re.compile(r"^(\s+|--[^\n]*\n?|/\*.*?\*/)+", re.S)


class SqlRefused(ValueError):
    """The statement is not a single read-only query."""


class SqlFailed(RuntimeError):
    """PostgreSQL could not run the statement (syntax, unknown column, timeout, ...)."""


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    stopped: str | None = None  # why the rows end before the result does (a row or byte limit)


# Statements a server-side cursor can hold: their rows are fetched a batch at a time, so
# a huge result never sits in this process's memory at once.
CURSOR_KEYWORDS = {"select", "with", "values", "table"}


def first_keyword(query: str) -> str:
    body = _LEADING_NOISE.sub("", query)
    match = re.match(r"\(*\s*([A-Za-z]+)", body)
    return match.group(1).lower() if match else ""


def check_read_only(query: str) -> str:
    """The statement's first keyword, if it is one a read-only query may start with."""
    if not query.strip():
        raise SqlRefused("empty query")
    keyword = first_keyword(query)
    if keyword not in READ_KEYWORDS:
        raise SqlRefused(
            f"streamrl sql runs read-only queries; {keyword.upper() or 'this statement'} is not allowed "
            f"(allowed: {', '.join(sorted(k.upper() for k in READ_KEYWORDS))})"
        )
    return keyword


@contextmanager
def readonly_rows(
    database_url: str,
    query: str,
    params: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
    max_value_chars: int | None = None,
):
    """(columns, an iterator of rows) of one read-only statement, in a READ ONLY
    transaction; a SELECT-like statement's rows come from a server-side cursor, in
    batches sized to about `FETCH_BYTES`. The whole read ends at `timeout_s`: the
    statement timeout, a watchdog outside the session and a deadline between batches.
    With `max_value_chars`, every value of a SELECT-like result comes as text cut by the
    server to one character more than that (so a caller sees what was cut), and no
    value larger ever reaches this process. Problems become SqlRefused / SqlFailed."""
    keyword = check_read_only(query)
    try:
        conn = connect(database_url)
    except psycopg.OperationalError as exc:
        raise SqlFailed(
            f"cannot connect to the ledger as its read-only role ({str(exc).strip()}); "
            "`streamrl db upgrade` creates the streamrl_reader role, or set "
            "STREAMRL_READONLY_DATABASE_URL"
        ) from None
    deadline = time.monotonic() + timeout_s
    with conn, conn.transaction(), _sql_errors(timeout_s), watchdog(conn, timeout_s):
        conn.execute("set transaction read only")
        conn.execute(f"set local statement_timeout = {int(timeout_s * 1000)}")
        if keyword in CURSOR_KEYWORDS:
            # DECLARE goes as a prepared statement too: more than one command is refused
            cur: psycopg.Cursor[Any] | psycopg.ServerCursor[Any] = conn.cursor(name="streamrl_sql")
            cur.execute(query, params or None)
            columns = [d.name for d in cur.description] if cur.description else []
            if max_value_chars is not None and columns:
                cur.close()
                cur = conn.cursor(name="streamrl_sql_text")
                cur.execute(values_as_text(query, len(columns), max_value_chars + 1), params or None)
        else:
            cur = conn.execute(query, params or None, prepare=True)
            columns = [d.name for d in cur.description] if cur.description else []
        yield columns, batches(cur, deadline, timeout_s)


FETCH_BYTES = 8 * 2**20  # what one batch of rows holds, roughly
MAX_TEXT_COLUMNS = 256


def values_as_text(query: str, width: int, cut: int) -> str:
    """`query`'s result with each value as text of at most `cut` characters, cut by
    PostgreSQL (a subquery in FROM keeps its rows' order when nothing above reorders them)."""
    if width > MAX_TEXT_COLUMNS:
        raise SqlRefused(f"the result has {width} columns; at most {MAX_TEXT_COLUMNS} are shown here")
    names = [f"c{i}" for i in range(width)]
    shown = ", ".join(f"left({name}::text, {cut})" for name in names)
    return f"select {shown} from (\n{query}\n) as streamrl_query({', '.join(names)})"


def batches(cur, deadline: float, timeout_s: float):
    """The cursor's rows: a server-side cursor's in batches of about FETCH_BYTES (one row
    first, then as many as the largest row so far allows), until the deadline; a plain
    cursor's (EXPLAIN, SHOW: a few rows) at once."""
    if not cur.description:
        return
    if not isinstance(cur, psycopg.ServerCursor):
        yield from cur.fetchall()
        return
    size, largest = 1, 1
    while batch := cur.fetchmany(size):
        if time.monotonic() > deadline:
            raise SqlFailed(f"statement timed out after {timeout_s:g} s (--timeout)")
        yield from batch
        largest = max(largest, *(row_bytes(row) for row in batch))
        size = max(1, min(1000, FETCH_BYTES // largest))


@contextmanager
def watchdog(conn: psycopg.Connection, timeout_s: float):
    """Cancels the session's statement once `timeout_s` has passed since it began, from
    outside the session: the statement timeout is a setting the query itself could lift
    (`set_config('statement_timeout', '0', true)` in its first batch), this is not."""
    timer = threading.Timer(timeout_s, conn.cancel_safe)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextmanager
def _sql_errors(timeout_s: float):
    try:
        yield
    except psycopg.errors.SyntaxError as exc:
        if "multiple commands" in str(exc):
            raise SqlRefused("exactly one statement is allowed; remove the ';'-separated extra ones") from None
        raise SqlFailed(str(exc).strip()) from None
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise SqlRefused(f"the ledger is read-only here: {str(exc).strip()}") from None
    except psycopg.errors.FeatureNotSupported as exc:
        if "data-modifying" not in str(exc):  # a write in a WITH, refused by the cursor before it runs
            raise SqlFailed(str(exc).strip()) from None
        raise SqlRefused(f"the ledger is read-only here: {str(exc).strip()}") from None
    except psycopg.errors.QueryCanceled:
        raise SqlFailed(f"statement timed out after {timeout_s:g} s (--timeout)") from None
    except psycopg.Error as exc:
        raise SqlFailed(str(exc).strip()) from None


def row_bytes(row: tuple) -> int:
    """A row's size, roughly: its text and bytes, and 16 for anything else."""
    return sum(len(v) if isinstance(v, (str, bytes, memoryview)) else 16 for v in row)


def run_readonly(
    database_url: str,
    query: str,
    params: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    max_value_chars: int | None = None,
) -> QueryResult:
    """One read-only statement's result, held in memory: at most `max_rows` rows and
    about `max_bytes` bytes of them (`stopped` says which limit ended it); with
    `max_value_chars`, values as text, a longer one cut and marked (`cut_value`)."""
    kept: list[tuple[Any, ...]] = []
    size, stopped = 0, None
    with readonly_rows(database_url, query, params, timeout_s, max_value_chars) as (columns, rows):
        for row in rows:
            if max_rows is not None and len(kept) >= max_rows:
                stopped = f"the first {max_rows:,} rows"
                break
            size += row_bytes(row)
            if max_bytes is not None and size > max_bytes:
                stopped = f"the first {len(kept):,} rows (about {max_bytes:,} bytes)"
                break
            kept.append(row if max_value_chars is None else tuple(cut_value(v, max_value_chars) for v in row))
    return QueryResult(columns, kept, stopped)


def cut_value(value: str | None, max_chars: int) -> str | None:
    """A text value of at most `max_chars` characters, saying where it was cut."""
    if value is None or len(value) <= max_chars:
        return value
    return value[:max_chars] + f" … (cut at {max_chars:,} characters)"


# C0 controls but tab and newline, DEL and C1: a model's response in the ledger may hold
# escape sequences (a window title, a clear screen, OSC 52's clipboard write)
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with its control characters written out (`\\x1b`), so that printing ledger
    text to a terminal never drives the terminal."""
    return CONTROL_CHARACTERS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def plain_value(value):
    """A SQL result value as plain Python for printing or JSON: bytes as \\x hex,
    timestamps as ISO text, numerics as int when whole, else float."""
    if isinstance(value, (bytes, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value
