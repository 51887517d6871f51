"""The ledger's writes: a batch of decoded events into their tables with the offsets
after it, in one transaction (the sink's exactly-once effect), and the `runs` row kept in
step with a run's life. consumers/ledger_sink.py is the loop around it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from kafka import TopicPartition
from psycopg.types.json import Jsonb, set_json_dumps

from streamrl.consumers.sample_arrays import TrajectoryArrays, digests
from streamrl.consumers.table_writer import TableWriter, json_dumps
from streamrl.runtime.dead_letters import refused_event
from streamrl.schema.events import DeadLetter, Event, RunEvent, Sample, Trajectory, WeightVersion
from streamrl.schema.ledger import SAMPLE_ARRAYS, TABLE_BY_EVENT, event_row

log = logging.getLogger("streamrl.ledger_sink")
SINK_STAGE = "ledger-sink"

RUN_STATUS = {"created": "created", "started": "running", "resumed": "running", "finished": "finished", "failed": "failed"}

# A run's life and its weight versions are stated once: another copy with other content
# is a dead letter. A rollout or a step re-done after a restart may differ (its timings):
# the first copy is kept.
WRITERS = {
    event_type: TableWriter(table, stated_once=event_type in (RunEvent, WeightVersion))
    for event_type, table in TABLE_BY_EVENT.items()
}


def create_staging_tables(conn: psycopg.Connection) -> None:
    """The COPY targets of `insert_events`, once per database session, in a transaction
    of their own: created inside a batch's, a rolled-back batch would take them along.
    The session's JSONB values are dumped by msgspec (the COPYs take them unwrapped)."""
    set_json_dumps(json_dumps, conn)
    with conn.transaction():
        for writer in WRITERS.values():
            conn.execute(writer.create_stage_sql)


@dataclass
class Placed:
    """A decoded event with the coordinates it was read from."""

    event: Event
    topic: str
    partition: int
    offset: int

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.event.event_id, self.topic, self.partition, self.offset)


def insert_events(
    conn: psycopg.Connection, placed: list[Placed], arrays: TrajectoryArrays | None = None, written_whole: dict | None = None
) -> list[Placed]:
    """Insert one batch (inside the caller's transaction), grouped by table; returns the
    events whose id the ledger already held with other content (not inserted). The
    session must have its staging tables (`create_staging_tables`).

    `arrays`: the trajectories known to be in the ledger, whose samples are stored without
    their arrays (as are those of trajectories this call writes whole); `written_whole`:
    gets the digests of the trajectories written whole (to remember once committed)."""
    by_type: dict[type, list[Placed]] = {}
    for p in sorted(placed, key=lambda p: not isinstance(p.event, Trajectory)):  # a sample's trajectory before it
        by_type.setdefault(type(p.event), []).append(p)
    conflicting: set[tuple] = set()  # (event id, topic, partition, offset)
    in_batch: dict[tuple[str, str], bytes] = {}
    with conn.cursor() as cur:
        # first: a new run's row brings its rollout tables (migration 0019's trigger)
        run_ids = sorted({p.event.run_id for p in placed})
        cur.executemany("insert into runs (run_id) values (%s) on conflict (run_id) do nothing", [(r,) for r in run_ids])
        for event_type, group in by_type.items():
            writer = WRITERS[event_type]
            conflicting |= writer.write(cur, [writer.params(ledger_row(p, arrays, in_batch)) for p in group])
            if event_type is Trajectory and arrays is not None and not writer.last_batch_staged:
                in_batch = digests([p.event for p in group if isinstance(p.event, Trajectory)])
                if written_whole is not None:
                    written_whole.update(in_batch)
        for p in placed:
            if isinstance(p.event, RunEvent) and p.key not in conflicting:
                apply_run_event(cur, p.event)
    return [p for p in placed if p.key in conflicting]


def ledger_row(p: Placed, arrays: TrajectoryArrays | None, in_batch: dict[tuple[str, str], bytes]) -> dict:
    row = event_row(p.event, p.topic, p.partition, p.offset)
    if arrays is not None and isinstance(p.event, Sample) and arrays.held(p.event, in_batch):
        row.update(dict.fromkeys(SAMPLE_ARRAYS), arrays_in_trajectory=True)
    return row


def conflict_letter(p: Placed) -> DeadLetter:
    """A second copy of an event id with other content: the ledger keeps the first."""
    reason = (
        f"{type(p.event).__name__} {p.event.event_id} repeats an event id the ledger holds, "
        "with other content (the first copy is kept)"
    )
    return refused_event(p.event, p.topic, p.partition, p.offset, reason, SINK_STAGE)


def apply_run_event(cur: psycopg.Cursor, event: RunEvent) -> None:
    """Keep the `runs` row (the current state of a run) in step with its lifecycle events."""
    cur.execute(
        """update runs set
             status = coalesce(%s, status),
             name = coalesce(nullif(%s, ''), name),
             config = coalesce(%s, config),
             parent_run_id = coalesce(%s, parent_run_id),
             updated_at = now()
           where run_id = %s""",
        (
            RUN_STATUS.get(event.kind),
            event.name if event.kind == "created" else "",  # the run's name, not a stage's
            Jsonb(event.config, dumps=json_dumps) if event.kind == "created" and event.config else None,
            event.parent_run_id,
            event.run_id,
        ),
    )


def save_offsets(conn: psycopg.Connection, consumer: str, next_offsets: dict[TopicPartition, int]) -> None:
    conn.cursor().executemany(
        """insert into consumer_offsets (consumer, topic, partition, next_offset) values (%s, %s, %s, %s)
           on conflict (consumer, topic, partition)
           do update set next_offset = excluded.next_offset, updated_at = now()""",
        [(consumer, tp.topic, tp.partition, offset) for tp, offset in next_offsets.items()],
    )


def load_offsets(conn: psycopg.Connection, consumer: str) -> dict[TopicPartition, int]:
    rows = conn.execute("select topic, partition, next_offset from consumer_offsets where consumer = %s", (consumer,)).fetchall()
    return {TopicPartition(t, p): o for t, p, o in rows}


def write_batch(
    conn: psycopg.Connection,
    placed: list[Placed],
    dead: list[DeadLetter],
    consumer: str,
    next_offsets: dict[TopicPartition, int],
    arrays: TrajectoryArrays | None = None,
) -> list[DeadLetter]:
    """Write a batch and the offsets after it in one transaction. A row the database
    rejects (say, a NUL byte in a text field) does not block the partition: the batch is
    retried event by event and the rejected ones become dead letters. Returns all dead
    letters written. `arrays`: see `insert_events`; only a batch written whole adds to it."""
    try:
        written_whole: dict[tuple[str, str], bytes] = {}
        with conn.transaction():
            conflicts = [conflict_letter(p) for p in insert_events(conn, placed + as_placed(dead), arrays, written_whole)]
            insert_events(conn, as_placed(conflicts))
            save_offsets(conn, consumer, next_offsets)
        if arrays is not None:
            arrays.remember(written_whole)
        return dead + conflicts
    except (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError) as batch_error:
        log.warning("batch rejected (%s); retrying event by event", batch_error)
    dead = list(dead)
    with conn.transaction():
        for p in placed:
            try:
                with conn.transaction():  # a savepoint
                    dead += [conflict_letter(c) for c in insert_events(conn, [p], arrays)]
            except (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError) as exc:
                dead.append(
                    DeadLetter(
                        run_id=p.event.run_id,
                        source_topic=p.topic,
                        source_partition=p.partition,
                        source_offset=p.offset,
                        raw=b"",
                        error=f"ledger rejected {type(p.event).__name__} {p.event.event_id}: {exc}{hint(exc)}".strip(),
                        stage=SINK_STAGE,
                    )
                )
        insert_events(conn, as_placed(dead))
        save_offsets(conn, consumer, next_offsets)
    return dead


def hint(exc: psycopg.Error) -> str:
    """What a rejection means where the database cannot say it."""
    if isinstance(exc, psycopg.errors.CheckViolation) and "no partition" in str(exc):
        return " (the run's rollout tables are gone: it was archived; `streamrl restore RUN` brings them back)"
    return ""


def as_placed(dead: list[DeadLetter]) -> list[Placed]:
    """Dead letters as rows, at the coordinates of the records they stand for."""
    return [Placed(d, d.source_topic, d.source_partition, d.source_offset) for d in dead]
