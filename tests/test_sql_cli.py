"""`streamrl sql` and `streamrl runs` through the real CLI."""

import json
import re
import subprocess
import sys
import time

import pytest

from streamrl.producers.synthetic import synthetic_events
from streamrl.runtime.topic_admin import create_run_topics
from tests.conftest import REPO, SinkThread, count_rows, run_cli, wait_for
from tests.test_ledger_sink import publish

LEDGER_TABLES = [
    "runs",
    "run_events",
    "tasks",
    "trajectories",
    "evaluations",
    "samples",
    "train_steps",
    "weight_versions",
    "dead_letters",
    "consumer_offsets",
    "blobs",
]


@pytest.fixture
def loaded_run(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    publish(stack, synthetic_events(run_id, 20))
    with SinkThread(stack, run_id):
        wait_for(lambda: count_rows(ledger, "train_steps", run_id) == 20, 60, what="the run's events")
    return run_id


def table_counts(conn):
    return {t: conn.execute(f"select count(*) from {t}").fetchone()[0] for t in LEDGER_TABLES}


@pytest.mark.parametrize(
    "statement, expected",
    [
        ("drop table runs", "DROP is not allowed"),
        ("insert into runs (run_id) values ('intruder')", "INSERT is not allowed"),
        ("update runs set status = 'hacked'", "UPDATE is not allowed"),
        ("delete from tasks", "DELETE is not allowed"),
        ("select 1; delete from runs", "exactly one statement"),
        ("with gone as (delete from tasks returning 1) select count(*) from gone", "read-only"),
        ("explain analyze delete from tasks", "read-only"),
        ("  -- a comment first\n TRUNCATE tasks", "TRUNCATE is not allowed"),
    ],
)
def test_writes_and_multiple_statements_are_refused(loaded_run, ledger, statement, expected):
    before = table_counts(ledger)
    result = run_cli("sql", statement)
    assert result.returncode == 1
    assert expected in result.stderr.replace("\n", " ")
    assert table_counts(ledger) == before


def test_select_as_table_csv_and_json(loaded_run):
    query = "select step, loss from train_steps where run_id = %(run)s order by step limit 3"
    table = run_cli("sql", query, "--param", f"run={loaded_run}", check=True)
    assert "step" in table.stdout and "(3 rows)" in table.stdout
    as_csv = run_cli("sql", query, "-p", f"run={loaded_run}", "--csv", check=True)
    assert as_csv.stdout.splitlines() == ["step,loss", "0,0.1", "1,0.1", "2,0.1"]
    as_json = run_cli("sql", query, "-p", f"run={loaded_run}", "--json", check=True)
    assert json.loads(as_json.stdout) == [{"step": i, "loss": 0.1} for i in range(3)]


def test_query_from_file_and_errors(loaded_run, tmp_path):
    path = tmp_path / "q.sql"
    path.write_text("select count(*) as n from tasks where run_id = %(run)s")
    result = run_cli("sql", "--file", str(path), "-p", f"run={loaded_run}", "--json", check=True)
    assert json.loads(result.stdout) == [{"n": 20}]
    bad = run_cli("sql", "select no_such_column from runs")
    assert bad.returncode == 1 and "no_such_column" in bad.stderr
    slow = run_cli("sql", "select pg_sleep(5)", "--timeout", "0.5")
    assert slow.returncode == 1 and "timed out" in slow.stderr
    usage = run_cli("sql", "select 1", "-p", "not a pair")
    assert usage.returncode == 2 and "NAME=VALUE" in usage.stderr


def test_runs_lists_the_run_with_its_counts(loaded_run):
    result = run_cli("runs", "--limit", "1000", env={"COLUMNS": "300"}, check=True)
    line = next(row for row in result.stdout.splitlines() if loaded_run[:10] in row)
    assert "running" in line and "20" in line


def superuser_attacks(conn) -> list[tuple[str, str]]:
    """What a superuser connection could do through `streamrl sql`, and the error the
    reader role gets instead (a regular expression)."""
    pid, user = conn.execute("select pg_backend_pid(), current_user").fetchone()
    return [
        ("select pg_read_file('/etc/hostname')", "permission denied for function pg_read_file"),
        ("select * from pg_ls_dir('/')", "permission denied for function pg_ls_dir"),
        (
            f"select pg_terminate_backend({pid})",  # migration 0017: no signals to any session
            "permission denied for function pg_terminate_backend",
        ),
        (f"select set_config('role', '{user}', false)", "permission denied for function set_config"),
        ("select lo_export(lo_from_bytea(0, 'x'::bytea), '/tmp/streamrl-lo-export')", "permission denied for function lo_export"),
        ("select dblink('dbname=postgres', 'select 1')", "function dblink"),
        ("copy (select 1) to '/tmp/streamrl-copy'", "COPY is not allowed"),
        (f"set role {user}", "SET is not allowed"),
        # migration 0014: no lock a migration could wait on, no other session's query text
        ("select pg_advisory_lock(1)", "permission denied for function pg_advisory_lock"),
        ("select pg_try_advisory_xact_lock(1)", "permission denied for function pg_try_advisory_xact_lock"),
        ("select query from pg_stat_activity", "permission denied for (view|relation) pg_stat_activity"),
        ("select * from pg_stat_get_activity(null)", "permission denied for function pg_stat_get_activity"),
    ]


def test_users_sql_runs_as_the_least_privileged_reader(loaded_run, ledger):
    assert (
        run_cli(
            "sql",
            "select current_user as u, pg_has_role(current_user, 'pg_read_server_files', 'member') as files",
            "--csv",
            check=True,
        ).stdout.splitlines()[1]
        == "streamrl_reader,False"
    )
    before = table_counts(ledger)
    for statement, expected in superuser_attacks(ledger):
        result = run_cli("sql", statement)
        assert result.returncode == 1, statement
        assert re.search(expected, " ".join(result.stderr.split())), (statement, result.stderr)
        assert "Traceback" not in result.stderr
    assert ledger.execute("select 1").fetchone() == (1,)  # not terminated
    assert table_counts(ledger) == before
    import os

    assert not os.path.exists("/tmp/streamrl-lo-export") and not os.path.exists("/tmp/streamrl-copy")
    slept = run_cli("sql", "select pg_sleep(600)", "--timeout", "2", timeout=60)
    assert slept.returncode == 1 and "statement timed out after 2 s" in slept.stderr


def test_ledger_text_is_printed_as_text_not_markup(stack):
    result = run_cli("sql", "select '[/bold]' as markup, ':train: [red]x[/red]' as emoji")
    assert result.returncode == 0, result.stderr
    assert "[/bold]" in result.stdout and ":train: [red]x[/red]" in result.stdout and "\U0001f686" not in result.stdout


@pytest.mark.parametrize(
    "attack",
    [
        "true) union all select key_sha256 from service_api_keys --",  # closes the parenthesis, ends the statement
        "E'\\'' ) union select 1 -- '",  # an escape string where a simple lexer and PostgreSQL's part
        "$$'$$) or (true",  # dollar quoting, likewise
        "true; select 1",
        "true /* ) */",
        "(true",
    ],
)
def test_the_rollout_filter_cannot_leave_its_condition(stack, attack):
    from streamrl.ui.queries import FilterRefused, Ledger

    with pytest.raises(FilterRefused):
        Ledger(stack.readonly_database_url).rollouts("any-run", where=attack)


def test_a_filter_that_is_one_condition_runs_and_the_reader_cannot_read_service_secrets(stack):
    from streamrl.ui.queries import Ledger

    assert Ledger(stack.readonly_database_url).rollouts("no-such-run", where="t.response_text like '%)%' and e.reward >= 0") == []
    for table in ("service_api_keys", "service_requests"):
        result = run_cli("sql", f"select count(*) from {table}")
        assert result.returncode == 1 and "permission denied" in result.stderr, result.stderr


def test_a_ten_million_row_query_stops_at_its_limit_in_bounded_memory(stack, tmp_path):
    """Rows come from a server-side cursor; the table stops at --max-rows and says so.
    Before, every row was fetched first (a 10^9-row query took the client to 5.3 GB)."""
    import psutil

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "sql",
            "select g, repeat('x', 20) as pad from generate_series(1, 10000000) g",
            "--max-rows",
            "50000",
            "--json",
        ],
        cwd=REPO,
        stdout=open(tmp_path / "out.json", "w"),
        stderr=open(tmp_path / "err.txt", "w"),
    )
    watched, peak = psutil.Process(process.pid), 0
    while process.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    process.wait()
    out, err = (tmp_path / "out.json").read_text(), (tmp_path / "err.txt").read_text()
    assert process.returncode == 0, err
    assert len(json.loads(out)) == 50000
    assert "stopped at the first 50,000 rows (--max-rows, --max-bytes)" in " ".join(err.split())
    assert peak < 600 * 2**20, f"{peak / 2**20:.0f} MB"
