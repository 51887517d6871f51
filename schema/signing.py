"""Signed frames: who may write a run's events.

Every frame a StreamRL process sends carries an HMAC-SHA256 under the run's key, and
every reader checks it before it decodes the frame, so a process that can reach the
broker but lacks the key cannot get an event accepted (docs/decisions.md, "Trust on the
bus"). The run's key is derived from the machine's bus key (`streamrl up` writes it to
STREAMRL_HOME/bus.key, mode 0600; STREAMRL_BUS_KEY gives it to processes elsewhere) and
the run id, so a frame signed for one run does not verify on another run's topic.

    0x05 | mac (32 bytes) | the frame (0x01 plain, 0x02 zstd or 0x03 reference)

The mac covers the frame's bytes; a reference frame carries its blob's sha256, which the
blob store checks, so a blob is covered too.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

from streamrl.schema.codec import FRAME_SIGNED, CodecError

MAC_BYTES = 32
SIGNED_OVERHEAD_BYTES = 1 + MAC_BYTES


@functools.lru_cache(maxsize=64)
def run_key(bus_key: bytes, run_id: str) -> bytes:
    """A run's key (computed once per process and run: every frame sent or read needs it)."""
    return hmac.new(bus_key, b"streamrl run key\0" + run_id.encode(), hashlib.sha256).digest()


def sign(key: bytes, frame: bytes) -> bytes:
    """`frame` with its mac under `key` (a run's key)."""
    return bytes([FRAME_SIGNED]) + hmac.new(key, frame, hashlib.sha256).digest() + frame


def verified(key: bytes, value: bytes | None, run_id: str) -> bytes:
    """The frame inside a signed `value`, once its mac verifies under `key`, run
    `run_id`'s key; CodecError otherwise (the reader dead-letters it)."""
    if not value or value[0] != FRAME_SIGNED:
        first = f"0x{value[0]:02x}" if value else "empty"
        raise CodecError(f"unsigned frame ({first}): this run's readers take only frames signed with run {run_id!r}'s key")
    if len(value) < SIGNED_OVERHEAD_BYTES + 1:
        raise CodecError(f"signed frame of {len(value)} bytes: too short to hold a mac and a frame")
    mac, frame = value[1:SIGNED_OVERHEAD_BYTES], value[SIGNED_OVERHEAD_BYTES:]
    if not hmac.compare_digest(mac, hmac.new(key, frame, hashlib.sha256).digest()):
        raise CodecError(f"signature does not verify with run {run_id!r}'s key: not written by this run's processes")
    return frame
