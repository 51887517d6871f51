"""the rollout tables partitioned by run: dropping a run's rollouts is dropping its tables

Revision ID: 0019
Revises: 0018

Tasks, trajectories, evaluations, samples and filtered groups are nearly all of a
ledger's bytes. Deleting a run's rows from one shared table leaves dead tuples that only
a vacuum reclaims, and takes time in proportion to the rows. Each of these tables is now
partitioned by `run_id` (PostgreSQL's LIST partitioning): a run's rows live in its own
tables (`streamrl_partition_name('tasks', run_id)`: `tasks_r_` and 16 hex digits of the
run id's md5, and so on), `streamrl archive` drops
them, and a query that names its run reads only that run's tables.

- Keys: `(run_id, id)` and `(run_id, event_id)`, since a partitioned table's unique keys
  must hold its partition key. An event id derives from its run, so this repeats the
  old uniqueness; the sink's `ON CONFLICT` names both columns.
- A run's tables come with its `runs` row: a trigger on `runs` calls
  `streamrl_run_partitions(run_id)`, which creates each table empty and attaches it
  (ATTACH locks the parent less than `CREATE TABLE ... PARTITION OF` would). `streamrl
  restore` calls it again after an archive dropped them. Both functions run as their
  owner (the migrating role), so a sink connecting as another role can still attach,
  and PUBLIC may not call them.
- There is no default partition: a row of a run without a `runs` row is an error, not
  a row in a catch-all table that a later attach would have to scan.
- Existing rows are copied into the new tables; the views over these tables are dropped
  and created again from their own definitions, read from the server before the change.
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

ROLLOUT_TABLES = ("tasks", "trajectories", "evaluations", "samples", "filtered_groups")

CREATE_FUNCTIONS = f"""
create or replace function streamrl_partition_name(parent text, run text) returns text
language sql immutable as $$ select parent || '_r_' || left(md5(run), 16) $$;

create or replace function streamrl_run_partitions(run text) returns void
language plpgsql security definer set search_path from current as $$
declare
    parent text;
    part text;
begin
    foreach parent in array array{list(ROLLOUT_TABLES)!r}::text[] loop
        part := streamrl_partition_name(parent, run);
        continue when to_regclass(format('%I', part)) is not null;
        begin
            execute format('create table %I (like %I including defaults including storage including compression)',
                           part, parent);
            execute format('alter table %I attach partition %I for values in (%L)', parent, part, run);
        exception when duplicate_table or unique_violation then
            null;  -- another session created it meanwhile
        end;
    end loop;
end $$;
revoke execute on function streamrl_run_partitions(text) from public;

create or replace function streamrl_runs_partitions() returns trigger
language plpgsql security definer set search_path from current as $$
begin
    perform streamrl_run_partitions(new.run_id);
    return null;
end $$;
revoke execute on function streamrl_runs_partitions() from public;

create trigger runs_partitions after insert on runs for each row execute function streamrl_runs_partitions();
"""

DROP_FUNCTIONS = """
drop trigger if exists runs_partitions on runs;
drop function if exists streamrl_runs_partitions();
drop function if exists streamrl_run_partitions(text);
drop function if exists streamrl_partition_name(text, text);
"""


def dependent_views(conn) -> list[tuple[str, str]]:
    """Every view reading the rollout tables, directly or through another view, as
    (name, definition), each after the views it reads."""
    rows = conn.exec_driver_sql(
        """
        with recursive reads(view, source) as (
            select distinct r.ev_class, d.refobjid from pg_depend d join pg_rewrite r on r.oid = d.objid
            where d.refobjid = any(%(tables)s::regclass[]) and r.ev_class <> d.refobjid
            union
            select distinct r.ev_class, d.refobjid from pg_depend d join pg_rewrite r on r.oid = d.objid
            join reads on d.refobjid = reads.view where r.ev_class <> d.refobjid
        )
        select reads.view::regclass::text, reads.source::regclass::text, pg_get_viewdef(reads.view) from reads
        """,
        {"tables": list(ROLLOUT_TABLES)},
    ).fetchall()
    definitions = {view: definition for view, _, definition in rows}
    sources = {view: {source for v, source, _ in rows if v == view and source in definitions} for view in definitions}
    ordered: list[str] = []
    while len(ordered) < len(definitions):
        ready = sorted(v for v in definitions if v not in ordered and sources[v] <= set(ordered))
        ordered.extend(ready)
    return [(view, definitions[view]) for view in ordered]


def plain_indexes(conn, table: str) -> list[str]:
    """CREATE INDEX statements of the table's indexes that no constraint owns."""
    rows = conn.exec_driver_sql(
        "select pg_get_indexdef(i.indexrelid) from pg_index i where i.indrelid = %(t)s::regclass "
        "and not exists (select 1 from pg_constraint c where c.conindid = i.indexrelid) order by i.indexrelid",
        {"t": table},
    ).fetchall()
    return [statement for (statement,) in rows]


def old_name(table: str) -> str:
    return f"{table}_before_0019"


def set_aside(conn, table: str, partitioned: bool) -> list[str]:
    """Rename the table and create it again, empty, with the same columns, partitioned by
    run or not; the CREATE INDEX statements of its own indexes, for `fill`."""
    indexes = plain_indexes(conn, table)
    op.execute(f"alter table {table} rename to {old_name(table)}")
    layout = " partition by list (run_id)" if partitioned else ""
    op.execute(
        f"create table {table} (like {old_name(table)} including defaults including storage including compression){layout}"
    )
    return indexes


def fill(table: str, partitioned: bool, indexes: list[str]) -> None:
    """The rows moved into the new table, the old one dropped, keys and indexes built."""
    old = old_name(table)
    op.execute(f"insert into {table} select * from {old}")
    op.execute(f"alter sequence {table}_id_seq owned by {table}.id")
    op.execute(f"drop table {old} cascade")  # cascade: the old layout's partitions
    if partitioned:
        op.execute(f"alter table {table} add constraint {table}_pkey primary key (run_id, id)")
        op.execute(f"alter table {table} add constraint uq_{table}_run_event unique (run_id, event_id)")
    else:
        op.execute(f"alter table {table} add constraint {table}_pkey primary key (id)")
        op.execute(f"alter table {table} add constraint {table}_event_id_key unique (event_id)")
    for statement in indexes:  # a partitioned table's read back as "ON ONLY", which would not reach its partitions
        op.execute(statement.replace(" ON ONLY ", " ON "))


def change_layout(partitioned: bool) -> None:
    conn = op.get_bind()
    views = dependent_views(conn)
    for view, _ in reversed(views):
        op.execute(f"drop view {view}")
    indexes = {table: set_aside(conn, table, partitioned) for table in ROLLOUT_TABLES}
    if partitioned:  # every run's tables, before any row moves
        op.execute(CREATE_FUNCTIONS)
        known_runs = " union ".join(f"select run_id from {old_name(t)}" for t in ROLLOUT_TABLES)
        op.execute(f"select streamrl_run_partitions(run_id) from (select run_id from runs union {known_runs}) r")
    else:
        op.execute(DROP_FUNCTIONS)
    for table in ROLLOUT_TABLES:
        fill(table, partitioned, indexes[table])
    for view, definition in views:
        op.execute(f"create view {view} as {definition}")


def upgrade() -> None:
    change_layout(partitioned=True)


def downgrade() -> None:
    change_layout(partitioned=False)
