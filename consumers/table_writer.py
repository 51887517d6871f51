"""Bulk, idempotent writes of event rows into one ledger table (the sink's COPY path),
with the two things PostgreSQL's binary COPY does not do for us: refuse an integer past
its column's width (it wraps it) and keep a text with a NUL (it refuses it)."""

from __future__ import annotations

import operator

import msgspec
import psycopg
from sqlalchemy import ARRAY, Table, Text
from sqlalchemy.dialects.postgresql import JSONB

from streamrl.schema.ledger import unique_event_key

# What differs between two copies of one event sent twice: where and when.
UNSTATED_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "created_at")


def json_dumps(value) -> bytes:
    return msgspec.json.encode(value)


# PostgreSQL's text and jsonb cannot hold NUL, and a model may sample the byte (a
# byte-level tokenizer's 0x00, a byte-fallback token): the ledger stores U+FFFD in its
# place, so the row is kept. The event on its topic keeps the exact text, and the
# ledger's token ids are exact.
NUL, NUL_STAND_IN = "\x00", "\ufffd"


def without_nul(value):
    """`value` with every NUL in its strings (keys too) replaced; the same object when
    it holds none."""
    if isinstance(value, str):
        return value.replace(NUL, NUL_STAND_IN) if NUL in value else value
    if isinstance(value, dict):
        pairs = [(without_nul(k), without_nul(v)) for k, v in value.items()]
        changed = any(ck is not k or cv is not v for (ck, cv), (k, v) in zip(pairs, value.items()))
        return dict(pairs) if changed else value
    if isinstance(value, list):
        cleaned = [without_nul(v) for v in value]
        return cleaned if any(c is not v for c, v in zip(cleaned, value)) else value
    return value


# PostgreSQL's name for each column type, for binary COPY (psycopg dumps by these).
_PG_TYPES = {
    "Text": "text",
    "Integer": "int4",
    "BigInteger": "int8",
    "Float": "float8",
    "Boolean": "bool",
    "LargeBinary": "bytea",
    "JSONB": "jsonb",
    "DateTime": "timestamptz",
}


def pg_type_name(column) -> str:
    if isinstance(column.type, ARRAY):
        return _PG_TYPES[type(column.type.item_type).__name__] + "[]"
    return _PG_TYPES[type(column.type).__name__]


class TableWriter:
    """Idempotent bulk insert into one ledger table.

    The fast path COPYs the batch (binary: token arrays go as they are, not as hex text)
    straight into the table inside a savepoint. Only when a row repeats an event_id the
    table already has (an event published twice, a batch read again after a crash) is
    the savepoint rolled back and the batch COPYed into a session-private staging table
    and moved with `INSERT ... SELECT ... ON CONFLICT (event_id) DO NOTHING` (`(run_id,
    event_id)` in the tables partitioned by run), which keeps the first copy. Repeats
    are rare, so most batches cost one COPY; the staged path cost a second write of
    every row and a truncate (docs/decisions.md)."""

    def __init__(self, table: Table, stated_once: bool = False):
        """`stated_once`: the table's events are facts a writer states once (a run's life,
        its weight versions): a second copy of an id with other content is reported by
        `write`, not kept silently."""
        self.table = table
        self.last_batch_staged = False  # whether `write`'s last batch took the staged path
        columns = [c for c in table.columns if c.name not in ("id", "ingested_at")]
        self.columns = [c.name for c in columns]
        self.types = [pg_type_name(c) for c in columns]
        json_columns = {c.name for c in table.columns if isinstance(c.type, JSONB)}
        self.json_columns = json_columns
        self._scrubbed = [i for i, c in enumerate(columns) if isinstance(c.type, (JSONB, Text))]
        # binary COPY wraps an integer past its column's width without a word: checked here
        self._bounded = [
            (i, c.name, 2 ** (31 if t == "int4" else 63))
            for i, (c, t) in enumerate(zip(columns, self.types))
            if t in ("int4", "int8")
        ]
        self._values = operator.itemgetter(*self.columns)
        names = ", ".join(self.columns)
        self.stage = f"stage_{table.name}"
        # Without constraints or defaults: a staged row is checked when it is moved.
        self.create_stage_sql = f"create temp table if not exists {self.stage} as select {names} from {table.name} with no data"
        self.direct_copy_sql = f"copy {table.name} ({names}) from stdin (format binary)"
        self.stage_copy_sql = f"copy {self.stage} ({names}) from stdin (format binary)"
        key = [c.name for c in unique_event_key(table)]
        self.move_sql = (
            f"insert into {table.name} ({names}) select {names} from {self.stage} on conflict ({', '.join(key)}) do nothing"
        )
        self.clear_sql = f"truncate {self.stage}"
        # a copy sent again (a restart, a re-announcement) differs in where and when it was sent only
        content = [name for name in self.columns if name not in UNSTATED_COLUMNS]
        self.conflicts_sql = (
            "select s.event_id, s.kafka_topic, s.kafka_partition, s.kafka_offset "
            f"from {self.stage} s join {table.name} t on {' and '.join(f't.{c} = s.{c}' for c in key)} "
            f"where ({', '.join('s.' + c for c in content)}) is distinct from ({', '.join('t.' + c for c in content)})"
            if stated_once
            else None
        )

    def params(self, row: dict) -> tuple:
        """The row's values in column order, for a binary COPY: its dumpers are chosen by
        column type, so a JSONB value goes as it is (no wrapper object a value)."""
        values = self._values(row)
        for i, name, bound in self._bounded:
            if values[i] is not None and not -bound <= values[i] < bound:
                raise psycopg.DataError(f"{self.table.name}.{name}: {values[i]} is out of the column's integer range")
        cleaned = {i: without_nul(values[i]) for i in self._scrubbed}
        if all(cleaned[i] is values[i] for i in cleaned):
            return values
        return tuple(cleaned.get(i, value) for i, value in enumerate(values))

    def _copy(self, cur: psycopg.Cursor, sql: str, rows: list[tuple]) -> None:
        with cur.copy(sql) as copy:
            copy.set_types(self.types)
            for row in rows:
                copy.write_row(row)

    def write(self, cur: psycopg.Cursor, rows: list[tuple]) -> set[tuple]:
        """Insert `rows`; (event id, topic, partition, offset) of each the ledger already
        held with other content (a `stated_once` table's; the first copy is kept)."""
        self.last_batch_staged = False
        try:
            with cur.connection.transaction():  # a savepoint inside the batch's transaction
                self._copy(cur, self.direct_copy_sql, rows)
            return set()
        except psycopg.errors.UniqueViolation:
            pass  # an event the ledger already holds: keep its first copy
        self.last_batch_staged = True  # which rows went in, and which copies stayed, is the table's to say
        self._copy(cur, self.stage_copy_sql, rows)
        conflicts = set(cur.execute(self.conflicts_sql).fetchall()) if self.conflicts_sql else set()
        cur.execute(self.move_sql)
        cur.execute(self.clear_sql)
        return conflicts
