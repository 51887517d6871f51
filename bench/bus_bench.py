"""Produce + consume msg/s of Trajectory events vs raw bytes of the same size, same broker,
same client settings, one run (target ratio >= 0.5)."""

import time

import numpy as np
from common import bench_settings, fresh_run_id
from kafka import TopicPartition

from streamrl.runtime.bus import EventPublisher, make_consumer, make_producer, unframe
from streamrl.runtime.topic_admin import create_topics
from streamrl.schema import codec, signing
from streamrl.schema.events import Trajectory, pack_float32, pack_int32, pack_mask
from streamrl.schema.topics import topic_name

N_MESSAGES = 20_000
N_TOKENS = 400  # ~4 KB frames, like the measured raw-broker figures


def trajectories(run_id):
    rng = np.random.default_rng(0)
    tokens = pack_int32(rng.integers(0, 150_000, N_TOKENS))
    mask = pack_mask(np.ones(N_TOKENS))
    logprobs = pack_float32(-rng.random(N_TOKENS))
    for i in range(N_MESSAGES):
        yield Trajectory(
            run_id=run_id,
            trajectory_id=f"t{i}",
            task_id=f"task{i}",
            group_id=f"g{i // 8}",
            tokens=tokens,
            loss_mask=mask,
            logprobs=logprobs,
            response_text="42",
        )


def consume_all(settings, topic, decode) -> float:
    consumer = make_consumer(settings, None)
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    seen, start = 0, time.perf_counter()
    while seen < N_MESSAGES:
        for records in consumer.poll(timeout_ms=1000, max_records=5000).values():
            for record in records:
                decode(record.value)
            seen += len(records)
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def main() -> None:
    settings = bench_settings()
    run_id = fresh_run_id("busbench")
    events_topic = topic_name(run_id, "trajectories")
    raw_topic = f"bench.{run_id}.raw"
    create_topics(settings, [events_topic, raw_topic])
    events = list(trajectories(run_id))
    size = len(codec.encode(events[0]))

    start = time.perf_counter()
    with EventPublisher(settings) as publisher:
        for event in events:
            publisher.publish(event)
    event_produce = time.perf_counter() - start
    key = signing.run_key(settings.bus_key, run_id) if settings.bus_key else None  # as every reader checks it
    event_consume = consume_all(settings, events_topic, lambda v: unframe(signing.verified(key, v, run_id) if key else v, None))

    payload = b"x" * size
    producer = make_producer(settings)
    start = time.perf_counter()
    for _i, event in enumerate(events):
        producer.send(raw_topic, key=event.group_id.encode(), value=payload)
    producer.flush()
    raw_produce = time.perf_counter() - start
    producer.close()
    raw_consume = consume_all(settings, raw_topic, lambda v: v)

    def rate(seconds):
        return N_MESSAGES / seconds

    event_rate = rate(event_produce + event_consume)
    raw_rate = rate(raw_produce + raw_consume)
    print(f"bus: {N_MESSAGES:,} messages of {size:,} bytes on {settings.kafka_bootstrap}")
    print(
        f"  Trajectory events: produce {rate(event_produce):8,.0f} msg/s  consume+decode {rate(event_consume):8,.0f} msg/s"
        f"  round {event_rate:8,.0f} msg/s"
    )
    print(
        f"  raw bytes:         produce {rate(raw_produce):8,.0f} msg/s  consume        {rate(raw_consume):8,.0f} msg/s"
        f"  round {raw_rate:8,.0f} msg/s"
    )
    ratio = event_rate / raw_rate
    print(f"  ratio events/raw: {ratio:.2f}  target >= 0.5: {'PASS' if ratio >= 0.5 else 'FAIL'}")


if __name__ == "__main__":
    main()
