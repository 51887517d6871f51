"""Read-only SQL over the ledger.

Four guards, strongest last: a friendly check of the statement's first keyword; the
query is sent as a prepared statement, which PostgreSQL refuses to build from more than
one command; it runs in a READ ONLY transaction with a statement timeout, so even a
write hidden in a CTE or an EXPLAIN ANALYZE cannot change the ledger; and the commands
connect as `streamrl_reader` (migration 0007: SELECT on the ledger and nothing else), so
server files, other sessions and other roles are out of reach whatever the query does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg

from runtime.db import connect

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


def first_keyword(query: str) -> str:
    body = _LEADING_NOISE.sub("", query)
    match = re.match(r"\(*\s*([A-Za-z]+)", body)
    return match.group(1).lower() if match else ""


def run_readonly(database_url: str, query: str, params: dict[str, Any] | None = None,
                 timeout_s: float = 30.0) -> QueryResult:
    if not query.strip():
        raise SqlRefused("empty query")
    keyword = first_keyword(query)
    if keyword not in READ_KEYWORDS:
        raise SqlRefused(
            f"streamrl sql runs read-only queries; {keyword.upper() or 'this statement'} is not allowed "
            f"(allowed: {', '.join(sorted(k.upper() for k in READ_KEYWORDS))})"
        )
    try:
        conn = connect(database_url)
    except psycopg.OperationalError as exc:
        raise SqlFailed(f"cannot connect to the ledger as its read-only role ({str(exc).strip()}); "
                        "`streamrl db upgrade` creates the streamrl_reader role, or set "
                        "STREAMRL_READONLY_DATABASE_URL") from None
    with conn:
        with conn.transaction():
            conn.execute("set transaction read only")
            conn.execute("select set_config('statement_timeout', %s, true)", (f"{int(timeout_s * 1000)}",))
            try:
                cur = conn.execute(query, params or None, prepare=True)
            except psycopg.errors.SyntaxError as exc:
                if "multiple commands" in str(exc):
                    raise SqlRefused("exactly one statement is allowed; remove the ';'-separated extra ones") from None
                raise SqlFailed(str(exc).strip()) from None
            except psycopg.errors.ReadOnlySqlTransaction as exc:
                raise SqlRefused(f"the ledger is read-only here: {str(exc).strip()}") from None
            except psycopg.errors.QueryCanceled:
                raise SqlFailed(f"statement timed out after {timeout_s:g} s (--timeout)") from None
            except psycopg.Error as exc:
                raise SqlFailed(str(exc).strip()) from None
            columns = [d.name for d in cur.description] if cur.description else []
            rows = cur.fetchall() if cur.description else []
    return QueryResult(columns, rows)


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
