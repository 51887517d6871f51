"""The Kafka side of every process: topics, producers, consumers, and event frames.

Tuned for the embedded broker and for small latency-sensitive hops:
- the group session timeout is short (Tansu answers a JoinGroup after about half of
  it; kafka-python's 45 s default meant a 23 s wait for the first message);
- consumers refresh metadata every few seconds so pattern subscriptions see new runs;
- producers wait for all replicas (`acks=all`) and linger a few ms to batch.
"""

from __future__ import annotations

from typing import Protocol

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from schema import codec
from schema.events import Event
from schema.topics import event_key, run_topics, topic_name
from streamrl.settings import Settings

# Room for the record batch and headers around one value.
FRAME_OVERHEAD_BYTES = 4096


class MessageTooLarge(ValueError):
    pass


class BlobWriter(Protocol):
    def put(self, sha256: str, data: bytes) -> None: ...


class BlobReader(Protocol):
    def get(self, sha256: str) -> bytes: ...


def create_topics(settings: Settings, names: list[str], partitions: int | None = None) -> list[str]:
    """Create the topics that do not exist yet; returns the names created."""
    admin = KafkaAdminClient(**settings.kafka_client_options())
    try:
        existing = set(admin.list_topics())
        missing = [n for n in names if n not in existing]
        created = []
        for name in missing:
            try:
                admin.create_topics([NewTopic(name, partitions or settings.topic_partitions, 1)])
                created.append(name)
            except TopicAlreadyExistsError:  # another process won the race
                pass
        return created
    finally:
        admin.close()


def create_run_topics(settings: Settings, run_id: str, partitions: int | None = None) -> list[str]:
    return create_topics(settings, list(run_topics(run_id).values()), partitions)


def make_producer(settings: Settings, **overrides) -> KafkaProducer:
    options = dict(
        acks="all",
        linger_ms=5,
        batch_size=512 * 1024,
        max_request_size=settings.max_message_bytes,
        retries=10,
    )
    options.update(overrides)
    return KafkaProducer(**settings.kafka_client_options(), **options)


def make_consumer(settings: Settings, group_id: str | None, **overrides) -> KafkaConsumer:
    session = settings.session_timeout_ms
    options = dict(
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session,
        heartbeat_interval_ms=max(100, min(1000, session // 3)),
        max_poll_interval_ms=300_000,
        metadata_max_age_ms=3000,
        fetch_max_wait_ms=100,
        max_partition_fetch_bytes=max(1_048_576, settings.max_message_bytes + FRAME_OVERHEAD_BYTES),
    )
    options.update(overrides)
    return KafkaConsumer(**settings.kafka_client_options(), **options)


def frame(event: Event, max_message_bytes: int, blobs: BlobWriter | None) -> bytes:
    """The bytes to send for `event`: inline (compressed when large) or a blob reference."""
    data = codec.encode(event)
    if len(data) <= max_message_bytes - FRAME_OVERHEAD_BYTES:
        return data
    if blobs is None:
        raise MessageTooLarge(
            f"{type(event).__name__} {event.event_id} encodes to {len(data)} bytes, over the broker "
            f"limit of {max_message_bytes} (STREAMRL_KAFKA_MAX_MESSAGE_BYTES), and this producer has "
            "no blob store to send it by reference"
        )
    reference, ref = codec.encode_reference(data)
    blobs.put(ref.sha256, data)
    return reference


def unframe(value: bytes | None, blobs: BlobReader | None) -> Event:
    """Decode a message value, fetching the payload first if it is a blob reference."""
    ref = codec.parse_reference(value) if value else None
    if ref is not None:
        if blobs is None:
            raise codec.CodecError(f"blob reference {ref.sha256} but no blob store to resolve it")
        value = blobs.get(ref.sha256)
    return codec.decode(value)


class EventPublisher:
    """Sends events to their run's topic, keyed so that a group shares a partition."""

    def __init__(self, settings: Settings, blobs: BlobWriter | None = None, **producer_overrides):
        self._settings = settings
        self._blobs = blobs
        self.producer = make_producer(settings, **producer_overrides)

    def publish(self, event: Event):
        topic = topic_name(event.run_id, event.KIND)
        value = frame(event, self._settings.max_message_bytes, self._blobs)
        return self.producer.send(topic, key=event_key(event), value=value)

    def flush(self, timeout: float | None = None) -> None:
        self.producer.flush(timeout)

    def close(self) -> None:
        self.producer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.flush()
        self.close()
