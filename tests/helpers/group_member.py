"""One consumer-group member, as a process that a test can SIGKILL: reads TOPIC in GROUP
and appends "partition offset" per record to OUT, committing after each batch.

    python tests/helpers/group_member.py kafka-python|faust BOOTSTRAP TOPIC GROUP OUT [INSTANCE_ID]

With INSTANCE_ID the member is static (KIP-345): restarted under the same id, it gets its
partitions back without a rebalance. The first line written to OUT is "joined SECONDS",
the time from the start of the process's main code to its first record.
"""

from __future__ import annotations

import sys
import tempfile
import time

SESSION_TIMEOUT_MS = 6000
BATCH_PAUSE_S = 0.02  # each batch "works" a little, so a run spans several seconds


def record(out, partition: int, offset: int, started: float, first: list) -> None:
    if not first:
        first.append(True)
        out.write(f"joined {time.monotonic() - started:.3f}\n")
    out.write(f"{partition} {offset}\n")


def kafka_python_member(bootstrap: str, topic: str, group: str, out, instance_id: str | None, started: float) -> None:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        group_instance_id=instance_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=1000,
        fetch_max_wait_ms=100,
        metadata_max_age_ms=3000,
    )
    consumer.subscribe([topic])
    first: list = []
    while True:
        batch = consumer.poll(timeout_ms=200, max_records=50)
        for tp, records in batch.items():
            for rec in records:
                record(out, tp.partition, rec.offset, started, first)
        if batch:
            out.flush()
            time.sleep(BATCH_PAUSE_S)
            consumer.commit()


def faust_member(bootstrap: str, topic: str, group: str, out, instance_id: str | None, started: float) -> None:
    import faust

    app = faust.App(
        group,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        datadir=tempfile.mkdtemp(prefix="streamrl-faust-member-"),  # not `<group>-data/` in the checkout
        consumer_group_instance_id=instance_id,
        broker_session_timeout=SESSION_TIMEOUT_MS / 1000,
        broker_heartbeat_interval=1.0,
        consumer_auto_offset_reset="earliest",
        topic_partitions=4,
    )
    source = app.topic(topic, value_serializer="raw", key_serializer="raw")
    first: list = []

    @app.agent(source)
    async def consume(stream):
        async for batch in stream.take_events(50, within=0.2):
            for event in batch:
                record(out, event.message.partition, event.message.offset, started, first)
            out.flush()

    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    client, bootstrap, topic, group, path = sys.argv[1:6]
    instance = sys.argv[6] if len(sys.argv) > 6 else None
    begun = time.monotonic()
    with open(path, "a", buffering=1) as sink:
        member = kafka_python_member if client == "kafka-python" else faust_member
        member(bootstrap, topic, group, sink, instance, begun)
