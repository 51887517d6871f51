"""Bytes on the wire: msgpack via msgspec, with a one-byte frame header.

Frame layout (first byte):
    0x01  msgpack of a tagged Event
    0x02  zstd-compressed msgpack (chosen when the plain frame exceeds
          `compress_over` bytes; long token arrays compress well)
    0x03  reference: msgpack {sha256, size} of a payload stored out of band
          (by `runtime.blobs`), used when even the compressed frame is larger
          than the broker accepts. The codec only builds and parses the
          reference; fetching the payload is the bus's job.
    0x04  bundle: msgpack list of frames of the types above, several events of one
          partition key in one Kafka record. Each event keeps its own id and is its
          own ledger row; what a record costs the broker and the consumers' record
          parsing is then shared by the bundle (docs/decisions.md).

Anything else is not a StreamRL event and `decode` raises `CodecError` saying why.
"""

from __future__ import annotations

import hashlib
import threading
import typing
from collections.abc import Sequence

import msgspec
import zstandard

from streamrl.schema.events import ALL_EVENT_TYPES, Event

FRAME_PLAIN = 0x01
FRAME_ZSTD = 0x02
FRAME_REFERENCE = 0x03
FRAME_BUNDLE = 0x04
FRAME_SIGNED = 0x05  # schema.signing: a mac, then one of the frames above

DEFAULT_COMPRESS_OVER = 256 * 1024
# Largest event a zstd frame may expand to: a frame that claims more (a decompression
# bomb, or garbage that looks like zstd) is refused, not allocated. A rollout of a million
# tokens with its logprobs, versions and text is about 20 MB; a reader decoding one frame
# at this limit holds about three times it.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(typing.Union[ALL_EVENT_TYPES])  # noqa: UP007 (a tuple of types, unpacked by Union[])
# zstandard's contexts are not thread safe (its documentation: "assume instances are not
# thread safe"), and a worker encodes from several threads: one pair a thread.
_zstd = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    compressor: zstandard.ZstdCompressor | None = getattr(_zstd, "compressor", None)
    if compressor is None:
        compressor = _zstd.compressor = zstandard.ZstdCompressor(level=3)
    return compressor


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_zstd, "decompressor", None)
    if decompressor is None:
        decompressor = _zstd.decompressor = zstandard.ZstdDecompressor()
    return decompressor


class CodecError(ValueError):
    """Bytes that are not a valid StreamRL event (the message says what is wrong)."""


class BlobReference(msgspec.Struct, frozen=True):
    sha256: str
    size: int


_reference_decoder = msgspec.msgpack.Decoder(BlobReference)
_bundle_decoder = msgspec.msgpack.Decoder(list[bytes])
# msgpack's list and bin headers around the frames of a bundle, at most
BUNDLE_OVERHEAD_BYTES = 5
FRAME_HEADER_BYTES = 5


def bundle(frames: list[bytes], max_bytes: int) -> list[bytes]:
    """Message values carrying `frames` in order: bundles of at most `max_bytes`, a
    frame alone (not wrapped) where it is by itself."""
    values: list[list[bytes]] = []
    current: list[bytes] = []
    size = BUNDLE_OVERHEAD_BYTES
    for frame in frames:
        if current and size + len(frame) + FRAME_HEADER_BYTES > max_bytes:
            values.append(current)
            current, size = [], BUNDLE_OVERHEAD_BYTES
        current.append(frame)
        size += len(frame) + FRAME_HEADER_BYTES
    if current:
        values.append(current)
    return [group[0] if len(group) == 1 else bytes([FRAME_BUNDLE]) + _encoder.encode(group) for group in values]


def split_bundle(data: bytes | None) -> Sequence[bytes | None]:
    """The frames of a message value: those of a bundle, else the value itself."""
    if not data or data[0] != FRAME_BUNDLE:
        return [data]
    try:
        frames = _bundle_decoder.decode(memoryview(data)[1:])
    except msgspec.DecodeError as exc:
        raise CodecError(f"malformed bundle frame: {exc}") from None
    if not frames:
        raise CodecError("empty bundle frame")
    return frames


def encode(event: Event, compress_over: int = DEFAULT_COMPRESS_OVER) -> bytes:
    payload = _encoder.encode(event)
    if len(payload) > compress_over:
        return bytes([FRAME_ZSTD]) + _zstd_compressor().compress(payload)
    return bytes([FRAME_PLAIN]) + payload


def encode_reference(frame: bytes) -> tuple[bytes, BlobReference]:
    """A small frame pointing at `frame`, which the caller stores under ref.sha256."""
    ref = BlobReference(sha256=hashlib.sha256(frame).hexdigest(), size=len(frame))
    return bytes([FRAME_REFERENCE]) + _encoder.encode(ref), ref


def parse_reference(data: bytes) -> BlobReference | None:
    """The reference carried by `data`, or None if `data` is an inline frame."""
    if not data or data[0] != FRAME_REFERENCE:
        return None
    try:
        return _reference_decoder.decode(memoryview(data)[1:])
    except msgspec.DecodeError as exc:
        raise CodecError(f"malformed blob reference frame: {exc}") from None


def decode(data: bytes | None) -> Event:
    """Decode one inline frame; raises CodecError naming what is wrong."""
    if not data:
        raise CodecError("empty message: expected a StreamRL event frame")
    frame = data[0]
    body: bytes | memoryview = memoryview(data)[1:]
    if frame == FRAME_ZSTD:
        try:
            size = zstandard.frame_content_size(body)
            if size > MAX_DECOMPRESSED_BYTES:
                raise CodecError(f"zstd frame would expand to {size} bytes, over the limit of {MAX_DECOMPRESSED_BYTES}")
            body = _zstd_decompressor().decompress(body, max_output_size=MAX_DECOMPRESSED_BYTES)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd frame does not decompress: {exc}") from None
    elif frame == FRAME_REFERENCE:
        raise CodecError("blob reference frame: resolve it through the blob store before decoding")
    elif frame == FRAME_BUNDLE:
        raise CodecError("bundle frame: split it (split_bundle) before decoding, and bundles do not nest")
    elif frame == FRAME_SIGNED:
        raise CodecError("signed frame: check its mac (schema.signing.verified) before decoding")
    elif frame != FRAME_PLAIN:
        raise CodecError(
            f"not a StreamRL event: first byte 0x{frame:02x}, expected a frame type "
            f"0x01 (msgpack), 0x02 (zstd), 0x03 (reference) or 0x04 (bundle)"
        )
    try:
        event: Event = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise CodecError(f"invalid event: {exc}") from None
    except msgspec.DecodeError as exc:
        raise CodecError(f"undecodable msgpack: {exc}") from None
    if event.schema_version > type(event).SCHEMA_VERSION:
        raise CodecError(
            f"{type(event).__name__} schema_version {event.schema_version} is newer than this "
            f"StreamRL understands ({type(event).SCHEMA_VERSION}); upgrade the consumer"
        )
    return event
