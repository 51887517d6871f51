"""A finished run's topics leave the broker once the ledger holds every event.

The embedded broker keeps every record in memory (the shipped broker has no other
storage engine, and it does not implement DeleteRecords), so a finished run's topics
would hold all their events for as long as the broker runs. The ledger is the durable
record: once the ledger sink's saved positions (table `consumer_offsets`, written in the
same transaction as the rows) reach the end of every partition of the run's topics,
the broker holds nothing the ledger lacks, and the topics are deleted. `show`, the UI,
`replay` (from the ledger) and `run --resume` read the ledger; `--resume` re-creates the
topics it needs (streamrl/recovery.py).

`service.broker.retention: keep` leaves them for Kafka-side replay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kafka import KafkaAdminClient, TopicPartition

from streamrl.runtime.bus import make_consumer
from streamrl.runtime.db import connect
from streamrl.runtime.service_config import Broker
from streamrl.runtime.settings import Settings
from streamrl.schema.topics import existing_run_topics

# Deleting a topic is asynchronous on the broker: how long to wait for it to go.
DELETE_WAIT_S = 30.0


@dataclass
class Retired:
    """What happened to a finished run's topics."""

    removed: list[str]
    records: int  # the records the removed topics held (all in the ledger)
    behind: dict[str, int]  # topic -> records found past what the ledger holds (topics then kept)

    def sentence(self, run_id: str) -> str:
        if self.behind:
            lag = ", ".join(sorted(topic.rsplit(".", 1)[-1] for topic in self.behind))
            return (
                f"kept run {run_id}'s topics on the broker: the ledger does not hold all their records yet "
                f"(records past its position on: {lag}); "
                f"`streamrl sink --run {run_id}` writes them, `streamrl topics {run_id} --remove` then frees them"
            )
        if not self.removed:
            return f"run {run_id} has no topics left on the broker"
        return (
            f"removed run {run_id}'s {len(self.removed)} topics from the broker "
            f"(the ledger holds all {self.records} records they held)"
        )


def run_partitions(settings: Settings, run_id: str) -> list[TopicPartition]:
    """Every partition of the run's topics the broker still has."""
    consumer = make_consumer(settings, None)
    try:
        return [
            TopicPartition(topic, p)
            for topic in existing_run_topics(run_id, consumer.topics())
            for p in consumer.partitions_for_topic(topic) or ()
        ]
    finally:
        consumer.close()


def ledger_positions(settings: Settings, topics: list[str]) -> dict[TopicPartition, int]:
    """How far the ledger sink has written each partition (the furthest of any sink)."""
    with connect(settings.database_url, autocommit=True) as conn:
        rows = conn.execute(
            "select topic, partition, max(next_offset) from consumer_offsets where topic = any(%s) group by topic, partition",
            (topics,),
        ).fetchall()
    return {TopicPartition(topic, partition): offset for topic, partition, offset in rows}


def records_past(
    settings: Settings, positions: dict[TopicPartition, int], partitions: list[TopicPartition], quiet_polls: int = 2
) -> dict[str, int]:
    """topic -> records the broker holds from `positions` on (none: absent), read rather
    than asked for: the embedded broker's ListOffsets(latest) answers the last batch's
    base offset, not the log's end. Stops at the first records found (the answer is then
    "some", not how many), or once every partition has answered a fetch at its position
    with nothing (its high watermark known): callers ask once nothing writes to these
    partitions, so an empty answer is final. Else after `quiet_polls` empty polls."""
    consumer = make_consumer(settings, None, fetch_max_wait_ms=200)
    try:
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, positions.get(tp, 0))
        quiet = 0
        while quiet < quiet_polls:
            batch = consumer.poll(timeout_ms=500)
            if not batch and all(consumer.highwater(tp) is not None for tp in partitions):
                batch = consumer.poll(timeout_ms=0)  # a fetch that answered with records since
                if not batch:
                    return {}
            if batch:
                return {tp.topic: len(records) for tp, records in batch.items()}
            quiet += 1
        return {}
    finally:
        consumer.close()


def delete_run_topics(settings: Settings, run_id: str) -> list[str]:
    """Delete the run's topics and wait until the broker no longer lists them."""
    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        doomed = existing_run_topics(run_id, admin.list_topics())
        delete_and_wait(admin, doomed)
        return doomed
    finally:
        admin.close()


def delete_and_wait(admin: KafkaAdminClient, topics: list[str]) -> None:
    """Delete `topics` (deletion is asynchronous on the broker) and wait until it no
    longer lists them."""
    if topics:
        admin.delete_topics(topics)
    deadline = time.monotonic() + DELETE_WAIT_S
    while set(topics) & set(admin.list_topics()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker did not delete the topics {topics} within {DELETE_WAIT_S:.0f} s")
        time.sleep(0.2)


def retire_run_topics(settings: Settings, run_id: str) -> Retired:
    """Delete a finished run's topics if the ledger holds every record they carry; else keep
    them and say what the ledger lacks. Call it once no process of the run reads or writes."""
    partitions = run_partitions(settings, run_id)
    if not partitions:
        return Retired(removed=[], records=0, behind={})
    positions = ledger_positions(settings, sorted({tp.topic for tp in partitions}))
    behind = records_past(settings, positions, partitions)
    if behind:
        return Retired(removed=[], records=0, behind=behind)
    held = sum(positions.get(tp, 0) for tp in partitions)
    return Retired(removed=delete_run_topics(settings, run_id), records=held, behind={})


def topic_configs(broker: Broker, settings: Settings) -> dict[str, str]:
    """The topic configs a run creates its topics with: `retention.ms` and
    `retention.bytes` on an external Kafka; refused on the embedded broker, which
    expires nothing."""
    configs = {
        name: str(value)
        for name, value in (("retention.ms", broker.retention_ms), ("retention.bytes", broker.retention_bytes))
        if value is not None
    }
    if configs and not settings.kafka_bootstrap_env:
        key = "retention_ms" if broker.retention_ms is not None else "retention_bytes"
        raise ValueError(
            f"service.broker.{key}: the embedded broker does not expire records (it holds a run's "
            "topics in memory until the run is over and they are removed; service.broker.window_steps "
            "bounds a long run); set it with an external Kafka (STREAMRL_KAFKA_BOOTSTRAP)"
        )
    return configs
