"""The group-wedge scenario: two members of a consumer group read a 4-partition topic;
one is SIGKILLed while the group is joining or rebalancing, and restarted. The trial
passes when every record has been read by some member. A group that wedges (members
joined but never given partitions again) never gets there.

Used by tests/test_group_wedge.py (20 trials per client) and bench/group_membership.py
(join and rejoin latencies, static vs dynamic membership).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaProducer

from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_admin import create_topics

MEMBER = Path(__file__).resolve().parent / "group_member.py"
PARTITIONS = 4


@dataclass
class Trial:
    client: str
    static: bool
    kill_after_s: float
    finished: bool
    seconds: float  # from the first start to the last record read
    rejoin_s: float | None  # the restarted member: process start to its first record


def produce(settings: Settings, topic: str, records: int) -> None:
    create_topics(settings, [topic], PARTITIONS)
    producer = KafkaProducer(**settings.kafka_client_options(), linger_ms=5)
    for i in range(records):
        producer.send(topic, key=str(i).encode(), value=b"x" * 64)
    producer.flush()
    producer.close()


def read_back(paths: list[Path]) -> tuple[set[tuple[int, int]], list[float]]:
    seen, joins = set(), []
    for path in paths:
        if path.exists():
            # Members are still appending while a trial polls: a read can end inside a
            # line, so only newline-terminated lines count (the tail is read next time).
            for line in path.read_text().split("\n")[:-1]:
                first, second = line.split()
                if first == "joined":
                    joins.append(float(second))
                else:
                    seen.add((int(first), int(second)))
    return seen, joins


def start_member(settings: Settings, client: str, topic: str, group: str, out: Path, instance: str | None):
    args = [sys.executable, str(MEMBER), client, settings.kafka_bootstrap, topic, group, str(out)]
    return subprocess.Popen(
        args + ([instance] if instance else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def run_trial(
    settings: Settings,
    workdir: Path,
    client: str,
    static: bool,
    topic: str,
    records: int,
    kill_after_s: float,
    timeout_s: float = 60.0,
) -> Trial:
    """Members a and b start together; a is SIGKILLed `kill_after_s` later (while the
    group forms, or mid-read) and restarted under the same name."""
    group = f"wedge-{uuid.uuid4().hex[:8]}"
    outs = {name: workdir / f"{group}-{name}.txt" for name in ("a", "b", "a2")}
    instance = (lambda name: f"{group}-{name}") if static else (lambda name: None)
    started = time.monotonic()
    members = [start_member(settings, client, topic, group, outs[n], instance(n)) for n in ("a", "b")]
    try:
        time.sleep(kill_after_s)
        members[0].send_signal(signal.SIGKILL)
        members[0].wait()
        members.append(start_member(settings, client, topic, group, outs["a2"], instance("a")))
        while time.monotonic() - started < timeout_s:
            seen, _ = read_back(list(outs.values()))
            if len(seen) >= records:
                break
            time.sleep(0.2)
        seen, _ = read_back(list(outs.values()))
        _, rejoin = read_back([outs["a2"]])
        return Trial(
            client, static, kill_after_s, len(seen) >= records, time.monotonic() - started, rejoin[0] if rejoin else None
        )
    finally:
        for member in members:
            if member.poll() is None:
                member.send_signal(signal.SIGKILL)
            member.wait()


def run_trials(
    settings: Settings,
    workdir: Path,
    client: str,
    static: bool,
    trials: int,
    records: int = 3000,
    seed: int = 0,
    concurrent: int = 1,
) -> list[Trial]:
    """`trials` trials on one topic (each its own group, `concurrent` at a time), kill
    times drawn from 0.3-4 s: a member joins in about 3.5 s here (the broker answers a
    JoinGroup after half the session timeout), so most kills land in the join, the rest
    in reading and rebalancing."""
    rng = random.Random(seed)
    topic = f"wedge-{client}-{uuid.uuid4().hex[:8]}"
    produce(settings, topic, records)
    kills = [rng.uniform(0.3, 4.0) for _ in range(trials)]
    with ThreadPoolExecutor(concurrent) as pool:
        return list(pool.map(lambda kill: run_trial(settings, workdir, client, static, topic, records, kill), kills))
