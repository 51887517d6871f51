"""The fault matrix: one run of the built-in recipe that suffers, at random steps, a
SIGKILL of each process type (restarted by `streamrl run`'s supervisor), a PostgreSQL
restart (every process waits for it), a burst of malformed and oversized records on
every topic (dead letters), and finally a broker restart that loses every topic
(`streamrl run --resume`). The faulty run rotates its topics by windows of steps
(service.broker.window_steps), retiring them while it trains. Its ledger must equal a fault-free run's of the same recipe
and seed: the same rows per table, the same tasks, trajectories and steps, every
trajectory accounted for, every sample trained once, and one dead letter per bad record.

The faulty and fault-free runs use their own embedded broker and PostgreSQL (a private
STREAMRL_HOME), since this test restarts both."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import zstandard
from kafka import KafkaProducer

from streamrl.runtime import db, services
from streamrl.runtime.settings import Settings
from streamrl.schema import codec
from streamrl.schema.events import Task
from streamrl.schema.topics import run_topics, topic_window
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, command_lines, free_port, process_of, run_cli, wait_for
from tests.conftest import broker_topics as broker_topic_names
from tests.test_rl_loop import assert_ledger_consistent, small_run_env

RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
STEPS = 40
KILLED = ("worker-0", "processor", "sink", "learner", "publisher")
TABLES = ("tasks", "trajectories", "evaluations", "train_steps", "weight_versions")


@pytest.fixture
def private_stack(monkeypatch):
    home = Path(tempfile.mkdtemp(prefix="streamrl-faults-"))
    home.chmod(0o755)
    monkeypatch.setenv("STREAMRL_HOME", str(home))
    monkeypatch.setenv("STREAMRL_KAFKA_PORT", str(free_port()))
    monkeypatch.setenv("STREAMRL_SERVICE_WAIT_S", "120")
    settings = Settings.from_env()
    services.up(settings)
    db.upgrade(settings.database_url)
    yield settings
    services.down(settings)


def query(settings: Settings, sql: str, *params):
    with db.connect(settings.database_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def steps_done(settings: Settings, run_id: str) -> int | None:
    try:
        return query(settings, "select count(*) from train_steps where run_id = %s", run_id)[0][0]
    except Exception:  # PostgreSQL is being restarted
        return None


def bad_records(settings: Settings, run_id: str) -> int:
    """Undecodable, truncated and oversized values on every topic of the run, a
    decompression bomb, an event of a schema version from the future and one of another
    run: each must become one dead letter, and nothing else change."""
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, max_request_size=3 * 2**20)
    rng = random.Random(7)
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (codec.MAX_DECOMPRESSED_BYTES + 1))  # about 2 KB
    values = [
        b"",
        b"\x00not an event",
        b"\x93\xa4junk",
        bytes(rng.getrandbits(8) for _ in range(256)),
        b"\xc1" * (settings.max_message_bytes - 8192),  # 1 MB of a byte msgpack never uses
        b"\xc1" * (settings.max_message_bytes + 51_424),  # over what the run's own producers may send
        b"\xc1" * (2 * 2**20),
        bytes([codec.FRAME_ZSTD]) + bomb,
        codec.encode(Task(run_id=run_id, task_id="from-the-future", group_id="g", schema_version=99)),
        codec.encode(Task(run_id="another-run", task_id="elsewhere", group_id="g")),
    ]
    sent = 0
    for kind, topic in run_topics(run_id).items():
        if kind == "dead_letters":
            continue
        for value in values:
            producer.send(topic, key=b"fault-matrix", value=value)
            sent += 1
    producer.flush()
    producer.close()
    return sent


def restart_postgres(settings: Settings, sink_log: Path) -> None:
    """Stop PostgreSQL until the run's sink has found it gone, then start it again."""
    state = settings.read_state()
    noticed = sink_log.read_text(errors="replace").count("lost PostgreSQL")
    services.stop_embedded_postgres(state["postgres"])
    wait_for(
        lambda: sink_log.read_text(errors="replace").count("lost PostgreSQL") > noticed,
        timeout=60,
        what="the run's sink to find PostgreSQL gone",
    )
    run_cli("up", check=True)  # as an operator would; it starts the server on the same socket


def restart_broker(settings: Settings) -> None:
    state = settings.read_state()
    services.stop_embedded_kafka(state.pop("kafka"))
    settings.write_state(state)
    run_cli("up", check=True)


def kill_run(run_id: str) -> None:
    for pid, args in command_lines().items():
        if "streamrl.cli" in args and run_id in " ".join(args) and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def ledger_facts(settings: Settings, run_id: str) -> dict:
    facts = {table: query(settings, f"select count(*) from {table} where run_id = %s", run_id)[0][0] for table in TABLES}
    facts["task ids"] = {r[0] for r in query(settings, "select task_id from tasks where run_id = %s", run_id)}
    facts["trajectory ids"] = {r[0] for r in query(settings, "select trajectory_id from trajectories where run_id = %s", run_id)}
    facts["steps"] = [r[0] for r in query(settings, "select step from train_steps where run_id = %s order by step", run_id)]
    # every training trajectory is a sample or in a filtered group's count
    facts["accounted"] = query(
        settings,
        """
        select (select count(*) from samples where run_id = %s)
             + (select coalesce(sum(received), 0) from filtered_groups where run_id = %s)""",
        run_id,
        run_id,
    )[0][0]
    facts["sample ids"] = {r[0] for r in query(settings, "select trajectory_id from samples where run_id = %s", run_id)}
    trained = [
        r[0] for r in query(settings, "select unnest(sample_ids || dropped_ids) from train_steps where run_id = %s", run_id)
    ]
    facts["trained twice"] = len(trained) - len(set(trained))
    facts["trained ids"] = set(trained)
    return facts


def test_fault_matrix_ends_with_the_ledger_of_a_fault_free_run(private_stack, tmp_path):
    settings = private_stack
    # sync mode: every step waits for its own rollouts, so the faults fall on several steps
    # 16 groups a step (the recipe's 32 halved): the faults need steps, not rollouts
    env = small_run_env(
        ARITH_STEPS=str(STEPS),
        ARITH_WARMUP_STEPS="30",
        ARITH_VALIDATE_EVERY="4",
        ARITH_SYNC_MODE="sync",
        ARITH_BATCH_PROMPTS="16",
    )
    reference = run_cli("run", RECIPE, "--run", "faults-reference", "--out", str(tmp_path / "reference"), env=env, timeout=600)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]

    run_id = f"faults-{uuid.uuid4().hex[:8]}"
    rng = random.Random(int(os.environ.get("STREAMRL_FAULT_SEED", "1")))
    faults = [*KILLED, "postgres restart", "bad records"]
    rng.shuffle(faults)  # in a random order, 1-3 s apart, from the first trained step on
    out = tmp_path / "faulty"
    # The faulty run rotates its topics in windows of 4 steps, retired as it trains (a
    # snapshot every 4 steps): its ledger must still equal the plain reference run's.
    rotation = ["service.broker.window_steps=4", "trainer.save_freq=4"]
    run = cli_popen(
        [sys.executable, "-m", "streamrl.cli", "run", RECIPE, *rotation, "--run", run_id, "--out", str(out)],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=open(tmp_path / "run.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    injected, bad = [], 0
    try:
        wait_for(
            lambda: run.poll() is not None or (steps_done(settings, run_id) or 0) >= 1, timeout=300, what="the first trained step"
        )
        for fault in faults:
            time.sleep(rng.uniform(1.0, 3.0))
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-4000:]
            done = steps_done(settings, run_id)
            if fault == "postgres restart":
                restart_postgres(settings, out / "logs" / "sink.log")
            elif fault == "bad records":
                bad = bad_records(settings, run_id)
            else:
                pid = process_of(run_id, fault)
                if pid is None:  # the publisher may have published everything already
                    continue
                os.kill(pid, signal.SIGKILL)
            injected.append((fault, done))
        # every killed process was restarted, and the supervisor's log says so
        supervisor_log = out / "logs" / "supervisor.log"
        for fault, _ in injected:
            if fault in KILLED:
                wait_for(
                    lambda fault=fault: f"{fault} exited with signal 9; restarting it" in supervisor_log.read_text(),
                    timeout=30,
                    what=f"the restart of {fault}",
                )
        broker_restart_at = steps_done(settings, run_id)
        assert broker_restart_at < STEPS, f"the run finished before the broker restart: {injected}"
        windows_held = sorted({topic_window(t) for t in broker_topic_names(settings, run_id)} - {None})
        if broker_restart_at >= 24:  # windows 0-2 are past a snapshot and out of every reader's hold
            assert windows_held and windows_held[0] > 0, (broker_restart_at, windows_held)
        restart_broker(settings)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
        kill_run(run_id)
    resumed = run_cli("run", "--resume", run_id, "--out", str(out), env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    assert {"processor", "sink", "learner", "worker-0", "postgres restart", "bad records"} <= dict(injected).keys()
    expected, got = ledger_facts(settings, "faults-reference"), ledger_facts(settings, run_id)
    for key in (*TABLES, "task ids", "trajectory ids", "steps"):
        assert got[key] == expected[key], key
    assert got["accounted"] == expected["accounted"]
    assert got["trained twice"] == expected["trained twice"] == 0
    assert got["trained ids"] == got["sample ids"] and expected["trained ids"] == expected["sample ids"]
    letters = query(
        settings,
        "select key, stage, source_topic, source_partition, source_offset, left(error, 400) from dead_letters where run_id = %s",
        run_id,
    )
    # every dead letter stands for one of the bad records (written with the key below), once
    others = [letter[1:] for letter in letters if letter[0] is None or bytes(letter[0]) != b"fault-matrix"]
    assert not others, f"dead letters of records this test did not write: {others}"
    assert len({letter[2:5] for letter in letters}) == len(letters) == bad, [letter[1:5] for letter in letters]
    assert query(settings, "select count(*) from dead_letters where run_id = %s", "faults-reference")[0][0] == 0
    with db.connect(settings.database_url, autocommit=True) as conn:
        assert_ledger_consistent(conn, run_id, steps=STEPS, staleness_threshold=0, wrote_bad_records=True)
    print(
        f"\nfault matrix: {len(injected) + 1} faults ({', '.join(f'{f} at step {s}' for f, s in injected)}, "
        f"broker restart at step {broker_restart_at}, topic windows then on the broker {windows_held}); "
        f"{got['trajectories']} trajectories, "
        f"{len(got['sample ids'])} samples, {bad} bad records -> {len(letters)} dead letters; "
        f"lost 0, trained twice {got['trained twice']}"
    )
