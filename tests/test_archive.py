"""`streamrl archive RUN` / `streamrl restore RUN`: a run's rollouts to Parquet and back,
against the machine's PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL, as CI sets it)
migrated into a fresh database. The round trip gives back every row as it was, the
files read as plain Parquet, and what reads rollouts says where they went."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

import numpy as np
import psycopg
import pyarrow.parquet as pq
import pytest
from psycopg.types.json import Jsonb

from streamrl.runtime import db
from streamrl.runtime.config import Recipe
from tests.conftest import external_ledger, run_cli

EXTERNAL_URL = os.environ.get("STREAMRL_TEST_EXTERNAL_DATABASE_URL")
pytestmark = pytest.mark.skipif(not EXTERNAL_URL, reason="needs an external PostgreSQL (STREAMRL_TEST_EXTERNAL_DATABASE_URL)")
TABLES = ("tasks", "trajectories", "evaluations", "samples", "filtered_groups")


@pytest.fixture(scope="module")
def ledger_url():
    with external_ledger("streamrl_archive") as url:
        yield url


def event(run_id: str, kind: str, n: int) -> dict:
    return {"event_id": f"{run_id}-{kind}-{n}", "run_id": run_id, "schema_version": 1, "created_at": datetime.now(UTC)}


def fill(conn, run_id: str, groups: int = 3, size: int = 4, status: str = "finished") -> None:
    """A finished run's rows in every archived table, with packed arrays, JSON and NULLs."""
    config = Jsonb(Recipe().to_dict())
    conn.execute("insert into runs (run_id, status, config) values (%s, %s, %s)", (run_id, status, config))
    conn.execute(
        "insert into run_events (event_id, run_id, schema_version, created_at, kind, sequence, config)"
        " values (%(event_id)s, %(run_id)s, 1, %(created_at)s, 'created', 1, %(config)s)",
        {**event(run_id, "created", 0), "config": config},
    )
    for g in range(groups):
        group = f"s000001-g{g:07d}"
        for i in range(size):
            task, trajectory = f"{group}-t{i}", f"{group}-{i}"
            tokens = np.arange(10 + i, dtype="<i4").tobytes()
            conn.execute(
                "insert into tasks (event_id, run_id, schema_version, created_at, task_id, group_id, sample_index, group_size,"
                " prompt, data, is_val, step, min_weight_version) values (%(event_id)s, %(run_id)s, 1, %(created_at)s,"
                " %(task)s, %(group)s, %(i)s, %(size)s, %(prompt)s, %(data)s, false, 1, 0)",
                {**event(run_id, "task", g * size + i), "task": task, "group": group, "i": i, "size": size,
                 "prompt": Jsonb([{"role": "user", "content": f"q{g} ✓ \"quoted\""}]), "data": Jsonb({"answer": g})},
            )  # fmt: skip
            conn.execute(
                "insert into trajectories (event_id, run_id, schema_version, created_at, trajectory_id, task_id, group_id,"
                " sample_index, group_size, weight_version, tokens, loss_mask, logprobs, token_versions, num_tokens,"
                " num_trained_tokens, prompt_length, response_text, turns, is_val, step, error) values (%(event_id)s,"
                " %(run_id)s, 1, %(created_at)s, %(traj)s, %(task)s, %(group)s, %(i)s, %(size)s, 0, %(tokens)s, %(mask)s,"
                " %(lp)s, null, %(n)s, 3, 7, %(text)s, null, false, 1, %(error)s)",
                {**event(run_id, "traj", g * size + i), "traj": trajectory, "task": task, "group": group, "i": i,
                 "size": size, "tokens": tokens, "mask": bytes(10 + i), "n": 10 + i, "text": "a response ✓\n#### 4",
                 "lp": np.full(10 + i, -0.5, "<f4").tobytes(), "error": None if i else "ValueError: boom"},
            )  # fmt: skip
            conn.execute(
                "insert into evaluations (event_id, run_id, schema_version, created_at, trajectory_id, task_id, group_id,"
                " reward, metrics, is_val, step) values (%(event_id)s, %(run_id)s, 1, %(created_at)s, %(traj)s, %(task)s,"
                " %(group)s, %(reward)s, %(metrics)s, false, 1)",
                {**event(run_id, "eval", g * size + i), "traj": trajectory, "task": task, "group": group,
                 "reward": float(i % 2), "metrics": Jsonb({"answer_boxed": 1.0})},
            )  # fmt: skip
            conn.execute(
                "insert into samples (event_id, run_id, schema_version, created_at, trajectory_id, group_id, advantage,"
                " reward, group_reward_mean, group_reward_std, group_size, weight_version, step, tokens, loss_mask,"
                " logprobs, num_tokens) values (%(event_id)s, %(run_id)s, 1, %(created_at)s, %(traj)s, %(group)s, 0.25,"
                " 1.0, 0.5, 0.5, %(size)s, 0, 1, %(tokens)s, %(tokens)s, %(tokens)s, %(n)s)",
                {**event(run_id, "sample", g * size + i), "traj": trajectory, "group": group, "size": size,
                 "tokens": tokens, "n": 10 + i},
            )  # fmt: skip
    conn.execute(
        "insert into filtered_groups (event_id, run_id, schema_version, created_at, group_id, reason, step, group_size,"
        " received, rewards, trajectory_ids) values (%(event_id)s, %(run_id)s, 1, %(created_at)s, 'g-x', 'zero std', 1, 2,"
        " 2, %(rewards)s, %(ids)s)",
        {**event(run_id, "filtered", 0), "rewards": [1.0, 1.0], "ids": ["a", "b"]},
    )


def fingerprint(conn, run_id: str) -> dict[str, tuple[int, str]]:
    """Each archived table's rows of the run: how many, and a digest of every column."""
    return {
        table: conn.execute(
            f"select count(*), coalesce(md5(string_agg(t::text, '|' order by t.id)), '') from {table} t where run_id = %s",
            (run_id,),
        ).fetchone()
        for table in TABLES
    }


def own_tables(conn, run_id: str) -> dict[str, bool]:
    """Whether each rollout table has the run's own partition now."""
    return {
        table: conn.execute("select to_regclass(streamrl_partition_name(%s, %s)) is not null", (table, run_id)).fetchone()[0]
        for table in TABLES
    }


def test_a_runs_rollouts_go_to_parquet_and_come_back_as_they_were(ledger_url, tmp_path):
    run_id, other = f"arch-{uuid.uuid4().hex[:8]}", f"keep-{uuid.uuid4().hex[:8]}"
    with db.connect(ledger_url, autocommit=True) as conn:
        fill(conn, run_id)
        fill(conn, other)
        before, others = fingerprint(conn, run_id), fingerprint(conn, other)
    env = {"STREAMRL_DATABASE_URL": ledger_url, "STREAMRL_HOME": str(tmp_path / "home")}
    archived = run_cli("archive", run_id, "--to", str(tmp_path / "archive"), env=env)
    assert archived.returncode == 0, archived.stderr
    said = " ".join(archived.stdout.split())  # the terminal's width wraps it anywhere
    assert "12 trajectories" in said and "1 filtered_groups" in said
    folder = tmp_path / "archive" / run_id
    with db.connect(ledger_url, autocommit=True) as conn:
        assert {table: rows for table, (rows, _) in fingerprint(conn, run_id).items()} == dict.fromkeys(TABLES, 0)
        assert own_tables(conn, run_id) == dict.fromkeys(TABLES, False)  # dropped, not emptied row by row
        assert fingerprint(conn, other) == others  # another run is untouched
        assert own_tables(conn, other) == dict.fromkeys(TABLES, True)
    # plain Parquet: the columns as the table's, JSON as text, packed arrays as bytes
    trajectories = pq.read_table(folder / "trajectories.parquet").to_pylist()
    assert len(trajectories) == 12 and trajectories[0]["error"] == "ValueError: boom"
    assert np.frombuffer(trajectories[1]["tokens"], "<i4").tolist() == list(range(11))
    assert pq.read_table(folder / "tasks.parquet").column("prompt")[0].as_py().startswith('[{"role": "user"')
    # what reads rollouts says where they went
    shown = run_cli("show", run_id, "--out", str(tmp_path / "report"), env={**env, "COLUMNS": "400"})
    assert shown.returncode == 0, shown.stderr
    assert f"its rollouts are archived in {folder}" in " ".join(shown.stdout.split())
    replay = run_cli("replay", run_id, "--into", f"{run_id}-again", env=env)
    assert replay.returncode != 0 and f"streamrl restore {run_id}" in " ".join((replay.stdout + replay.stderr).split())
    again = run_cli("archive", run_id, "--to", str(tmp_path / "archive"), env=env)
    assert again.returncode != 0 and "already holds an archive" in " ".join(again.stderr.split())
    restored = run_cli("restore", run_id, "--from", str(tmp_path / "archive"), env=env)
    assert restored.returncode == 0, restored.stderr
    with db.connect(ledger_url, autocommit=True) as conn:
        assert fingerprint(conn, run_id) == before  # every column of every row, ids included
        assert own_tables(conn, run_id) == dict.fromkeys(TABLES, True)


def test_a_running_run_is_not_archived(ledger_url, tmp_path):
    run_id = f"live-{uuid.uuid4().hex[:8]}"
    with db.connect(ledger_url, autocommit=True) as conn:
        fill(conn, run_id, groups=1, status="running")
    env = {"STREAMRL_DATABASE_URL": ledger_url, "STREAMRL_HOME": str(tmp_path / "home")}
    refused = run_cli("archive", run_id, "--to", str(tmp_path / "archive"), env=env)
    assert refused.returncode != 0 and "is running: archive a finished or failed run" in " ".join(refused.stderr.split())
    assert not (tmp_path / "archive" / run_id).exists()


def test_a_query_naming_its_run_reads_only_that_runs_tables(ledger_url):
    run_id, other = f"read-{uuid.uuid4().hex[:8]}", f"else-{uuid.uuid4().hex[:8]}"
    with db.connect(ledger_url, autocommit=True) as conn:
        fill(conn, run_id, groups=1)
        fill(conn, other, groups=1)
        plan = "\n".join(r[0] for r in conn.execute("explain select * from trajectories where run_id = %s", (run_id,)))
        mine = conn.execute("select streamrl_partition_name('trajectories', %s)", (run_id,)).fetchone()[0]
        theirs = conn.execute("select streamrl_partition_name('trajectories', %s)", (other,)).fetchone()[0]
    assert mine in plan and theirs not in plan, plan


def test_migrating_to_tables_partitioned_by_run_keeps_every_row_and_view_and_goes_back():
    """Migration 0019 on a ledger that already holds runs, and its downgrade."""
    from alembic import command

    with external_ledger("streamrl_partitions", revision="0018") as url:
        runs = [f"old-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        views = "select table_name, view_definition from information_schema.views where table_schema = 'public' order by 1"
        with db.connect(url, autocommit=True) as conn:
            for run_id in runs:
                fill(conn, run_id)
            before, views_before = [fingerprint(conn, r) for r in runs], conn.execute(views).fetchall()
        db.upgrade(url, "0019")
        with db.connect(url, autocommit=True) as conn:
            assert [fingerprint(conn, r) for r in runs] == before
            assert conn.execute(views).fetchall() == views_before  # dropped and created again as they were
            assert all(own_tables(conn, r) == dict.fromkeys(TABLES, True) for r in runs)
            fill(conn, "new-run")  # a run created after the migration gets its tables from its runs row
            assert own_tables(conn, "new-run") == dict.fromkeys(TABLES, True)
            with pytest.raises(psycopg.errors.UniqueViolation):  # an event id is still a row once
                conn.execute(
                    "insert into evaluations (event_id, run_id, schema_version, created_at, trajectory_id, group_id,"
                    " reward, is_val, step) values (%s, %s, 1, now(), 't', 'g', 0, false, 1)",
                    (f"{runs[0]}-eval-0", runs[0]),
                )
        command.downgrade(db.alembic_config(url), "0018")
        with db.connect(url, autocommit=True) as conn:
            assert [fingerprint(conn, r) for r in runs] == before
            assert conn.execute(views).fetchall() == views_before
            assert conn.execute("select count(*) from pg_inherits").fetchone()[0] == 0


def test_a_rollout_of_an_archived_run_becomes_a_dead_letter_that_says_so(ledger_url, tmp_path):
    """A late or forged record of an archived run has no table to go to: the sink keeps
    its partition moving and records why."""
    from kafka import TopicPartition

    from streamrl.archive import archive_run
    from streamrl.consumers.ledger_writes import Placed, create_staging_tables, write_batch
    from streamrl.producers.synthetic import synthetic_events

    run_id = f"late-{uuid.uuid4().hex[:8]}"
    with db.connect(ledger_url, autocommit=True) as conn:
        fill(conn, run_id, groups=1)
    archive_run(ledger_url, run_id, tmp_path)
    late = next(synthetic_events(run_id, 1, ["Trajectory"]))
    with db.connect(ledger_url, autocommit=True) as conn:
        create_staging_tables(conn)
        dead = write_batch(conn, [Placed(late, "t", 0, 7)], [], "test-sink", {TopicPartition("t", 0): 8})
        letters = conn.execute("select error from dead_letters where run_id = %s", (run_id,)).fetchall()
    assert [d.source_offset for d in dead] == [7]
    assert len(letters) == 1 and "it was archived; `streamrl restore RUN` brings them back" in letters[0][0], letters
