"""Ledger tables (SQLAlchemy Core) and the mapping from an event to its row.

One table per event type. Every event row has the event's unique `event_id`, its
`run_id` and the Kafka coordinates it was read from, so any row can be traced back to
the message that produced it. Column names equal the event's field names; packed token
arrays are `bytea` (decode them in SQL with `streamrl_int32s(...)`,
`streamrl_float32s(...)`, `streamrl_uint8s(...)`, created by the first migration),
free-form structures (metrics, data rows, turns) are JSONB so SQL can reach into them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from streamrl.schema.events import (
    DeadLetter,
    Evaluation,
    Event,
    GroupFiltered,
    RunEvent,
    Sample,
    Task,
    TrainStep,
    Trajectory,
    WeightVersion,
    unpack_int32,
    unpack_mask,
)

metadata = MetaData()


def _event_columns() -> list[Column[Any]]:
    return [
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("event_id", Text, nullable=False, unique=True),
        Column("run_id", Text, nullable=False),
        *_event_tail(),
    ]


ROLLOUT_TABLE_NAMES = ("tasks", "trajectories", "evaluations", "samples", "filtered_groups")


def _rollout_columns(table_name: str) -> list[Any]:
    """A rollout table's event columns: partitioned by run (migration 0019), so its keys
    hold `run_id` and a run's rows can be dropped with its tables."""
    return [
        Column("id", BigInteger, autoincrement=True),
        Column("event_id", Text, nullable=False),
        Column("run_id", Text, nullable=False),
        *_event_tail(),
        PrimaryKeyConstraint("run_id", "id", name=f"{table_name}_pkey"),
        UniqueConstraint("run_id", "event_id", name=f"uq_{table_name}_run_event"),
    ]


def unique_event_key(table: Table) -> list[Column[Any]]:
    """The columns an event's row is unique on, which `ON CONFLICT` names."""
    return [table.c.run_id, table.c.event_id] if table.name in ROLLOUT_TABLE_NAMES else [table.c.event_id]


def _event_tail() -> list[Column[Any]]:
    return [
        Column("schema_version", Integer, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("ingested_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("kafka_topic", Text),
        Column("kafka_partition", Integer),
        Column("kafka_offset", BigInteger),
    ]


runs = Table(
    "runs",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("name", Text),
    Column("status", Text, nullable=False, server_default="unknown"),
    Column("config", JSONB),
    Column("parent_run_id", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

run_events = Table(
    "run_events",
    metadata,
    *_event_columns(),
    Column("kind", Text, nullable=False),
    Column("sequence", Integer, nullable=False),
    Column("name", Text),
    Column("config", JSONB),
    Column("parent_run_id", Text),
    Column("message", Text),
    Column("details", JSONB),
    Index("ix_run_events_run", "run_id", "created_at"),
)

tasks = Table(
    "tasks",
    metadata,
    *_rollout_columns("tasks"),
    Column("task_id", Text, nullable=False),
    Column("group_id", Text, nullable=False),
    Column("sample_index", Integer, nullable=False),
    Column("group_size", Integer, nullable=False),
    Column("prompt", JSONB),
    Column("data", JSONB),
    Column("is_val", Boolean, nullable=False),
    Column("step", Integer, nullable=False),
    Column("min_weight_version", Integer, nullable=False),
    Index("ix_tasks_run_step", "run_id", "step"),
    Index("ix_tasks_run_group", "run_id", "group_id"),
    Index("ix_tasks_task", "run_id", "task_id"),
    postgresql_partition_by="LIST (run_id)",
)

trajectories = Table(
    "trajectories",
    metadata,
    *_rollout_columns("trajectories"),
    Column("trajectory_id", Text, nullable=False),
    Column("task_id", Text, nullable=False),
    Column("group_id", Text, nullable=False),
    Column("sample_index", Integer, nullable=False),
    Column("group_size", Integer, nullable=False, server_default="1"),
    Column("weight_version", Integer, nullable=False),
    Column("tokens", LargeBinary, nullable=False),
    Column("loss_mask", LargeBinary, nullable=False),
    Column("logprobs", LargeBinary, nullable=False),
    Column("token_versions", LargeBinary),
    Column("newest_weight_version", Integer),  # = weight_version unless the rollout spans versions
    Column("num_tokens", Integer, nullable=False),
    Column("num_trained_tokens", Integer, nullable=False),
    Column("prompt_length", Integer, nullable=False),
    Column("prompt_text", Text),
    Column("response_text", Text),
    Column("turns", JSONB),
    Column("finish_reason", Text),
    Column("timings", JSONB),
    Column("worker_id", Text),
    Column("is_val", Boolean, nullable=False),
    Column("step", Integer, nullable=False),
    Column("extra_fields", JSONB),
    Column("error", Text),
    Column("source_event_id", Text),
    Index("ix_trajectories_run_step", "run_id", "step"),
    Index("ix_trajectories_run_group", "run_id", "group_id"),
    Index("ix_trajectories_run_version", "run_id", "weight_version"),
    Index("ix_trajectories_traj", "run_id", "trajectory_id"),
    Index("ix_trajectories_run_id_id", "run_id", "id"),  # keyset pages of one run (migration 0011)
    postgresql_partition_by="LIST (run_id)",
)

evaluations = Table(
    "evaluations",
    metadata,
    *_rollout_columns("evaluations"),
    Column("trajectory_id", Text, nullable=False),
    Column("task_id", Text),
    Column("group_id", Text, nullable=False),
    Column("reward", Float, nullable=False),
    Column("metrics", JSONB),
    Column("ground_truth", JSONB),
    Column("extra_info", JSONB),
    Column("evaluator", Text),
    Column("is_val", Boolean, nullable=False),
    Column("step", Integer, nullable=False),
    Column("error", Text),
    Column("source_event_id", Text),
    Index("ix_evaluations_run_step", "run_id", "step"),
    Index("ix_evaluations_run_group", "run_id", "group_id"),
    Index("ix_evaluations_traj", "run_id", "trajectory_id"),
    postgresql_partition_by="LIST (run_id)",
)

samples = Table(
    "samples",
    metadata,
    *_rollout_columns("samples"),
    Column("trajectory_id", Text, nullable=False),
    Column("group_id", Text, nullable=False),
    Column("advantage", Float, nullable=False),
    Column("token_advantages", LargeBinary),
    Column("reward", Float, nullable=False),
    Column("group_reward_mean", Float, nullable=False),
    Column("group_reward_std", Float, nullable=False),
    Column("group_size", Integer, nullable=False),
    Column("estimator", Text),
    Column("weight_version", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    # NULL where `arrays_in_trajectory`: the same bytes as the trajectory's (migration 0020)
    Column("tokens", LargeBinary),
    Column("loss_mask", LargeBinary),
    Column("logprobs", LargeBinary),
    Column("token_versions", LargeBinary),
    Column("num_tokens", Integer, nullable=False),
    Column("arrays_in_trajectory", Boolean, nullable=False, server_default=false()),
    Index("ix_samples_run_step", "run_id", "step"),
    Index("ix_samples_run_group", "run_id", "group_id"),
    Index("ix_samples_run_version", "run_id", "weight_version"),
    Index("ix_samples_traj", "run_id", "trajectory_id"),
    postgresql_partition_by="LIST (run_id)",
)

filtered_groups = Table(
    "filtered_groups",
    metadata,
    *_rollout_columns("filtered_groups"),
    Column("group_id", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("step", Integer, nullable=False),
    Column("group_size", Integer, nullable=False),
    Column("received", Integer, nullable=False),
    Column("rewards", ARRAY(Float)),
    Column("trajectory_ids", ARRAY(Text)),
    Index("ix_filtered_groups_run_step", "run_id", "step"),
    postgresql_partition_by="LIST (run_id)",
)

train_steps = Table(
    "train_steps",
    metadata,
    *_event_columns(),
    Column("step", Integer, nullable=False),
    Column("weight_version", Integer, nullable=False),
    Column("loss", Float, nullable=False),
    Column("kl", Float),
    Column("entropy", Float),
    Column("clip_fraction", Float, nullable=False),
    Column("grad_norm", Float, nullable=False),
    Column("lr", Float, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("sample_ids", ARRAY(Text)),
    Column("trained_advantages", ARRAY(Float)),
    Column("dropped_ids", ARRAY(Text)),
    Column("staleness", JSONB),
    Column("seconds", Float, nullable=False),
    Column("consumed_offsets", JSONB),
    Column("metrics", JSONB),
    Column("group_ids", ARRAY(Text)),
    Index("ix_train_steps_run_step", "run_id", "step"),
    Index("ix_train_steps_run_version", "run_id", "weight_version"),
    Index("ix_train_steps_group_ids", "group_ids", postgresql_using="gin"),
)

weight_versions = Table(
    "weight_versions",
    metadata,
    *_event_columns(),
    Column("version", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("uri", Text),
    Column("sha256", Text),
    Column("broadcast", JSONB),  # weight.transport distributed: where and how it was sent
    Index("ix_weight_versions_run_version", "run_id", "version"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    *_event_columns(),
    Column("source_topic", Text, nullable=False),
    Column("source_partition", Integer, nullable=False),
    Column("source_offset", BigInteger, nullable=False),
    Column("key", LargeBinary),
    Column("raw", LargeBinary),
    Column("error", Text, nullable=False),
    Column("stage", Text),
    Index("ix_dead_letters_run", "run_id", "created_at"),
    Index("ix_dead_letters_source", "source_topic", "source_partition", "source_offset"),
)

# Payloads too large for one Kafka message, stored by content hash (see schema.codec).
blobs = Table(
    "blobs",
    metadata,
    Column("sha256", Text, primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

TABLE_BY_EVENT: dict[type[Event], Table] = {
    RunEvent: run_events,
    Task: tasks,
    Trajectory: trajectories,
    Evaluation: evaluations,
    Sample: samples,
    GroupFiltered: filtered_groups,
    TrainStep: train_steps,
    WeightVersion: weight_versions,
    DeadLetter: dead_letters,
}

# Columns the ledger adds to every event row (identity, arrival, Kafka coordinates).
ROW_COLUMNS = ("id", "ingested_at", "kafka_topic", "kafka_partition", "kafka_offset")

# Columns computed from the event rather than copied from a field.
_DERIVED: dict[type[Event], Callable[[Any], dict[str, Any]]] = {
    Trajectory: lambda e: {
        "num_tokens": len(e.tokens) // 4,
        "num_trained_tokens": int(unpack_mask(e.loss_mask).sum()) if e.loss_mask else 0,
        "newest_weight_version": int(unpack_int32(e.token_versions).max()) if e.token_versions else e.weight_version,
    },
    Sample: lambda e: {"num_tokens": len(e.tokens) // 4, "arrays_in_trajectory": False},
}


DERIVED_COLUMNS = {
    "trajectories": ("num_tokens", "num_trained_tokens", "newest_weight_version"),
    "samples": ("num_tokens", "arrays_in_trajectory"),
}

# A sample's packed arrays, which the ledger keeps once, in its trajectory's row, where
# they are the same bytes (the sink checks; `arrays_in_trajectory` says so).
SAMPLE_ARRAYS = ("tokens", "loss_mask", "logprobs", "token_versions")


def field_column_mismatches(event_type: type[Event], table: Table) -> list[str]:
    """Where an event's fields and its table's columns disagree: a field with no column
    would be silently dropped by the sink, a column with no field never filled. The
    msgspec struct is the source of truth; the table and the migrations follow it."""
    fields = set(event_type.__struct_fields__)
    columns = {column.name for column in table.columns}
    extra = set(ROW_COLUMNS) | set(DERIVED_COLUMNS.get(table.name, ()))
    problems = [f"{event_type.__name__}.{name}: no column in table {table.name}" for name in sorted(fields - columns)]
    problems += [f"{table.name}.{name}: no field in {event_type.__name__}" for name in sorted(columns - fields - extra)]
    return problems


# Fields holding nested Structs, which must become plain dicts for JSONB.
_NESTED = {Trajectory: ("turns",), WeightVersion: ("broadcast",)}


def event_row(event: Event, topic: str | None = None, partition: int | None = None, offset: int | None = None) -> dict[str, Any]:
    """The ledger row of `event` (plain Python values; JSONB columns hold builtins)."""
    row = msgspec.structs.asdict(event)  # shallow and fast: this runs for every row the sink writes
    for name in _NESTED.get(type(event), ()):
        row[name] = msgspec.to_builtins(row[name])
    row["created_at"] = datetime.fromtimestamp(event.created_at, tz=UTC)
    row["kafka_topic"], row["kafka_partition"], row["kafka_offset"] = topic, partition, offset
    derive = _DERIVED.get(type(event))
    if derive:
        row.update(derive(event))
    return row


E = TypeVar("E", bound=Event)


def row_event(event_type: type[E], row: dict[str, Any]) -> E:
    """The event a ledger row was written from (the inverse of `event_row`): how replay
    and recovery re-publish what the ledger holds once the broker no longer does."""
    fields = {name: row[name] for name in event_type.__struct_fields__ if name in row and row[name] is not None}
    fields["created_at"] = row["created_at"].timestamp()
    return msgspec.convert(fields, event_type)


def query_events(conn: Any, event_type: type[E], query: str, params: tuple[Any, ...]) -> list[E]:
    """The events of the rows a `select * from <event table> ...` query returns."""
    cur = conn.execute(query, params)
    names = [d.name for d in cur.description]
    return [row_event(event_type, dict(zip(names, row))) for row in cur.fetchall()]


# Where each ledger consumer is in each partition, written in the same transaction as
# the rows it consumed: the database, not the broker, is the source of truth for
# progress, so a killed consumer resumes exactly where its last commit left it.
consumer_offsets = Table(
    "consumer_offsets",
    metadata,
    Column("consumer", Text, primary_key=True),
    Column("topic", Text, primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("next_offset", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
