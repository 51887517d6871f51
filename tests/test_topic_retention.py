"""A finished run's topics leave the embedded broker once the ledger holds every record
they carry (runtime/topic_retention.py), on the real broker and PostgreSQL. A whole run
that removes its topics, then is resumed: tests/test_rl_loop.py; a run that keeps them
for a Kafka-side replay: tests/test_replay.py."""

from __future__ import annotations

import os
import re

from streamrl.producers.synthetic import synthetic_events
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.services import broker_memory_bytes
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema.topics import run_topics
from tests.cli_zygote import cli_popen
from tests.conftest import SinkThread, broker_topics, count_rows, run_cli, wait_for


def test_topics_stay_until_the_ledger_holds_every_record_then_go(stack, ledger, run_id):
    create_run_topics(stack, run_id)
    events = list(synthetic_events(run_id, 50, types=["Task", "Trajectory"]))
    with EventPublisher(stack) as publisher:
        for event in events:
            publisher.publish(event)
    # nothing has written them to the ledger: the topics stay, and the command says why
    kept = run_cli("topics", run_id, "--remove")
    said = " ".join(kept.stdout.split())
    assert kept.returncode == 1 and "kept run" in said and "tasks" in said and "trajectories" in said, said
    assert broker_topics(stack, run_id) == set(run_topics(run_id).values())

    with SinkThread(stack, run_id):
        wait_for(
            lambda: count_rows(ledger, "trajectories", run_id) == 50 and count_rows(ledger, "tasks", run_id) == 50,
            120,
            what="the sink to write 100 events",
        )
    removed = run_cli("topics", run_id, "--remove")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert f"removed run {run_id}'s 8 topics" in " ".join(removed.stdout.split())
    assert not broker_topics(stack, run_id)
    assert count_rows(ledger, "trajectories", run_id) == 50  # the ledger keeps what the topics held
    again = run_cli("topics", run_id, "--remove")
    assert again.returncode == 0 and "has no topics left" in again.stdout


def test_status_shows_the_embedded_brokers_memory(stack):
    memory = broker_memory_bytes(stack)
    assert memory is not None and memory > 1_000_000
    result = run_cli("status", env={"COLUMNS": "200"}, check=True)
    assert " MB" in result.stdout and "memory" in result.stdout


def test_retention_ms_goes_to_an_external_kafka_and_is_refused_by_the_embedded_broker(stack):
    import dataclasses

    import pytest

    from streamrl.runtime.service_config import Broker
    from streamrl.runtime.topic_retention import topic_configs

    assert topic_configs(Broker(), stack) == {}
    external = dataclasses.replace(stack, kafka_bootstrap_env="kafka-0:9092")
    assert topic_configs(Broker(retention_ms=3_600_000), external) == {"retention.ms": "3600000"}
    assert topic_configs(Broker(retention_bytes=2**30), external) == {"retention.bytes": str(2**30)}
    with pytest.raises(ValueError, match=re.escape("service.broker.retention_bytes: the embedded broker does not expire")):
        topic_configs(Broker(retention_bytes=2**30), stack)
    with pytest.raises(ValueError, match=re.escape("service.broker.retention_ms: the embedded broker does not expire records")):
        topic_configs(Broker(retention_ms=3_600_000), stack)
    result = run_cli("recipe", "validate", "recipes/arith/recipe.yaml", "service.broker.retention_ms=60000", timeout=120)
    said = " ".join(result.stdout.split() + result.stderr.split())
    assert result.returncode != 0 and "service.broker.retention_ms: the embedded broker" in said, said


def test_the_task_publisher_waits_for_room_on_the_broker(stack, run_id):
    """A paced publisher (the run's task publisher) opens a window only while the broker
    holds fewer than BROKER_WINDOWS of the run's; past STREAMRL_SERVICE_WAIT_S it says
    what the broker still holds. Other publishers only follow the tasks' windows."""
    import dataclasses

    import pytest
    from kafka import KafkaAdminClient

    from streamrl.runtime.topic_admin import WindowTopics, broker_windows, create_window_topics
    from streamrl.runtime.topic_retention import delete_and_wait, delete_run_topics
    from streamrl.schema.topics import BROKER_WINDOWS, ROTATED_KINDS, window_topic

    for window in range(BROKER_WINDOWS):  # 0-5: a sink that retired none of them
        create_window_topics(stack, run_id, window, 1)
    hurried = dataclasses.replace(stack, service_wait_s=1)
    with pytest.raises(RuntimeError) as waited:
        WindowTopics(hurried, paced=True).open(run_id, BROKER_WINDOWS - 1, lambda: 1)  # would make window 6 ahead
    assert f"run {run_id}: the broker still holds its topic windows [0, 1, 2, 3, 4, 5] after 1 s" in str(waited.value)
    assert broker_windows(stack, run_id) == set(range(BROKER_WINDOWS))  # nothing made while it waited

    admin = KafkaAdminClient(**stack.kafka_client_options())
    try:  # the sink retires window 0
        delete_and_wait(admin, [window_topic(run_id, kind, 0) for kind in ROTATED_KINDS])
    finally:
        admin.close()
    WindowTopics(hurried, paced=True).open(run_id, BROKER_WINDOWS - 1, lambda: 1)
    assert broker_windows(stack, run_id) == set(range(1, BROKER_WINDOWS + 1))
    WindowTopics(hurried).open(run_id, BROKER_WINDOWS, lambda: 1)  # not paced: window 7 ahead at once
    assert broker_windows(stack, run_id) == set(range(1, BROKER_WINDOWS + 2))
    delete_run_topics(stack, run_id)


def test_a_long_run_with_a_small_window_keeps_a_bounded_set_of_topics(stack, ledger, run_id, tmp_path):
    """96 steps in windows of 8 (14 windows with the one made ahead), a snapshot every 8
    steps: the sink retires windows as the run trains, the broker never holds more than
    BROKER_WINDOWS of them (the task publisher waits for the sink, whatever the machine's
    load), and the ledger is exactly that of a run without rotation."""
    import subprocess
    import sys
    import time

    from streamrl.schema.topics import BROKER_WINDOWS, topic_window
    from tests.conftest import REPO
    from tests.test_rl_loop import RECIPE, assert_ledger_consistent, small_run_env

    # 8 groups a step: the test counts windows, not rollouts
    groups = 8
    env = {
        **os.environ,
        **small_run_env(
            ARITH_STEPS="96",
            ARITH_WARMUP_STEPS="30",
            ARITH_VALIDATE_EVERY="32",
            ARITH_SYNC_MODE="sync",
            ARITH_BATCH_PROMPTS=str(groups),
        ),
    }
    run = cli_popen(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "run",
            RECIPE,
            "service.broker.window_steps=8",
            "trainer.save_freq=8",
            "--run",
            run_id,
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    alive: list[tuple[int, int]] = []  # (trained steps, windows on the broker)
    while run.poll() is None:
        windows = {topic_window(t) for t in broker_topics(stack, run_id)} - {None}
        alive.append((count_rows(ledger, "train_steps", run_id), len(windows)))
        time.sleep(0.5)
    said = " ".join(run.stdout.read().split())
    assert run.returncode == 0, said[-3000:]
    left = re.search(r"(\d+) of run \S+ 14 topic windows \(8 steps each\) left the broker while it trained", said)
    print(f"\nwindows on the broker by trained steps: {alive[::4]}")
    assert alive and max(n for _, n in alive) <= BROKER_WINDOWS, alive
    assert left and int(left.group(1)) >= 14 - BROKER_WINDOWS, said[-2000:]
    assert not broker_topics(stack, run_id)
    assert_ledger_consistent(ledger, run_id, steps=96, staleness_threshold=0)
    assert (
        count_rows(ledger, "tasks", run_id) == 96 * groups * 8 + 4 * 200
    )  # every training and validation task (8 rollouts a group)
