"""What a reader does with a record it cannot use: it checks that an event is on its own
run's topic of its kind, and turns a record it refuses into a dead letter, bounded in
size whatever the record's."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from streamrl.schema import codec
from streamrl.schema.events import DeadLetter, Event


def check_placement(event: Event, topic_run_id: str, topic_kind: str) -> None:
    """An event belongs on its own run's topic of its kind; one found elsewhere was
    written by mistake or by someone else, and is refused (CodecError)."""
    if event.KIND != topic_kind:
        raise codec.CodecError(f"{type(event).__name__} event on a {topic_kind} topic (expected kind {event.KIND})")
    if event.run_id != topic_run_id:
        named = repr(event.run_id[:100]) + (f" ({len(event.run_id):,} characters)" if len(event.run_id) > 100 else "")
        raise codec.CodecError(f"event of run {named} on a topic of run {topic_run_id!r}")


# What a dead letter keeps of the record it stands for. The record may be as large as the
# broker takes (or larger than this producer may send): kept whole, the dead letter could
# not be published, its reader would crash on it at every restart, and a flood of garbage
# would fill the ledger. Its size and hash are kept instead of the rest.
DEAD_LETTER_RAW_BYTES = 64 * 1024
DEAD_LETTER_KEY_BYTES = 1024
DEAD_LETTER_ERROR_CHARS = 4000


def dead_letter(record, run_id: str, error: str, stage: str) -> DeadLetter:
    """A record that could not be used, with its coordinates and the reason; its value
    kept whole up to DEAD_LETTER_RAW_BYTES (beyond, the first bytes, its size and sha256)."""
    raw, key = record.value or b"", record.key
    if len(error) > DEAD_LETTER_ERROR_CHARS:  # an error may quote the input
        error = error[:DEAD_LETTER_ERROR_CHARS] + f"... ({len(error):,} characters)"
    if len(raw) > DEAD_LETTER_RAW_BYTES:
        error += (
            f" [the record's value is {len(raw):,} bytes, sha256 {hashlib.sha256(raw).hexdigest()}; "
            f"the first {DEAD_LETTER_RAW_BYTES:,} are kept]"
        )
        raw = raw[:DEAD_LETTER_RAW_BYTES]
    if key is not None and len(key) > DEAD_LETTER_KEY_BYTES:
        error += f" [the record's key is {len(key):,} bytes; the first {DEAD_LETTER_KEY_BYTES:,} are kept]"
        key = key[:DEAD_LETTER_KEY_BYTES]
    return DeadLetter(
        run_id=run_id,
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        key=key,
        raw=raw,
        error=error,
        stage=stage,
    )


def refused_event(event: Event, topic: str, partition: int, offset: int, reason: str, stage: str) -> DeadLetter:
    """An event a reader decoded and then refused (a weight version that cannot be its
    learner's, a second copy of a fact with other content): its dead letter keeps it
    encoded again, bounded like any other."""
    record = SimpleNamespace(topic=topic, partition=partition, offset=offset, key=None, value=codec.encode(event))
    return dead_letter(record, event.run_id, f"refused: {reason}", stage)
