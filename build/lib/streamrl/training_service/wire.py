"""The Tinker API's wire format, both ways, for `streamrl serve-training`.

Forward/backward requests arrive as the API's protobuf (`tinker.proto`, optionally zstd
compressed); their results and sampling results go back as protobuf; everything else is
JSON shaped by the client's own pydantic types (`tinker.types`). A malformed request is
a `WireError` naming the datum and field, answered 400 before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from streamrl.algos.service_losses import REQUIRED_INPUTS, SERVICE_LOSSES
from streamrl.training_service.limits import ServiceLimits, decompress_capped, too_large

PROTO_CONTENT_TYPE = "application/x-protobuf"
_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class WireError(ValueError):
    """A request the service cannot run: the message names what is wrong."""


@dataclass
class Datum:
    tokens: np.ndarray  # int64 [T]: the model input
    inputs: dict[str, np.ndarray]  # loss_fn_inputs, each [T]


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict
    forward_only: bool
    data: list[Datum]


def _tensor(msg: pb.Tensor, where: str) -> np.ndarray:
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise WireError(f"{where}: unsupported dtype {msg.dtype}")
    if msg.HasField("sparse_csr"):
        raise WireError(f"{where}: sparse tensors are not supported; send it dense")
    array = np.frombuffer(msg.dense, dtype=dtype)
    if msg.shape and int(np.prod(list(msg.shape))) != array.size:
        raise WireError(f"{where}: shape {list(msg.shape)} does not match its {array.size} values")
    return array


def plain_body(body: bytes, content_encoding: str | None, limits: ServiceLimits) -> bytes:
    """The request body, decompressed (streamed, capped) when the client compressed it (zstd)."""
    if content_encoding == "zstd":
        return decompress_capped(body, limits.max_decompressed_bytes)
    if content_encoding not in (None, "", "identity"):
        raise WireError(f"Content-Encoding: {content_encoding!r} is not served (zstd or none)")
    return body


def decode_forward_backward(body: bytes, limits: ServiceLimits | None = None) -> ForwardBackward:
    """The request, checked; `limits` bound its tokens where it arrives (the executor
    decodes again what was accepted, under whatever limits applied then: None)."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as error:  # protobuf raises its own DecodeError
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({error})") from None
    if msg.loss_fn not in SERVICE_LOSSES.names():
        raise WireError(f"loss_fn: {msg.loss_fn!r} is not served; choose one of {', '.join(SERVICE_LOSSES.names())}")
    config = {k: v for k, v in msg.loss_fn_config.items()}
    config.update({k: (v.text if v.WhichOneof("value") == "text" else v.number) for k, v in msg.loss_fn_config_v2.items()})
    if not msg.data:
        raise WireError("data: a forward_backward needs at least one datum")
    data, total_tokens = [], 0
    for i, datum in enumerate(msg.data):
        if len(datum.model_input_spans) or len(datum.loss_fn_input_spans):
            raise WireError(f"data[{i}]: provenance spans (stable_reinforce) are not served")
        parts = []
        for chunk in datum.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise WireError(f"data[{i}].model_input: only text (token) chunks are served, not {chunk.WhichOneof('chunk')}")
            parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
        tokens = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        if tokens.size == 0:
            raise WireError(f"data[{i}].model_input: empty")
        if limits is not None and tokens.size > limits.max_tokens_per_datum:
            raise too_large(f"data[{i}].model_input", tokens.size, "max_tokens_per_datum", limits.max_tokens_per_datum)
        total_tokens += tokens.size
        if limits is not None and total_tokens > limits.max_tokens_per_request:
            raise too_large("data (tokens in all)", total_tokens, "max_tokens_per_request", limits.max_tokens_per_request)
        inputs = {name: _tensor(t, f"data[{i}].loss_fn_inputs.{name}") for name, t in datum.loss_fn_inputs.items()}
        for name in ("target_tokens",) + REQUIRED_INPUTS[msg.loss_fn]:
            if name == "weights" and name not in inputs:
                inputs[name] = np.ones(tokens.size, np.float32)  # cross_entropy without weights: every token
            if name not in inputs:
                raise WireError(f"data[{i}].loss_fn_inputs.{name}: required by loss_fn {msg.loss_fn}")
        for name, array in inputs.items():
            if array.size != tokens.size:
                raise WireError(f"data[{i}].loss_fn_inputs.{name}: {array.size} values for {tokens.size} input tokens")
        data.append(Datum(tokens=tokens, inputs=inputs))
    return ForwardBackward(
        model_id=msg.model_id,
        seq_id=msg.seq_id,
        loss_fn=msg.loss_fn,
        loss_fn_config=config,
        forward_only=msg.forward_only,
        data=data,
    )


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """Per-datum output arrays (float32, one value per token) as one batched record."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    msg.metrics.update({k: float(v) for k, v in metrics.items()})
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in outputs[0] if outputs else {}:
        arrays = [np.ascontiguousarray(out[name], dtype=np.float32) for out in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        field = record.fields[name]
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = offsets.tobytes()
        field.dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


def encode_sample_response(
    sequences: list[tuple[list[int], list[float], str]], prompt_logprobs: list[float] | None = None
) -> bytes:
    """(tokens, logprobs, stop reason "stop" | "length") per sampled sequence."""
    msg = pb.SampleResponse()
    for tokens, logprobs, reason in sequences:
        seq = msg.sequences.add()
        seq.tokens = np.asarray(tokens, np.int32).tobytes()
        seq.logprobs = np.asarray(logprobs, np.float32).tobytes()
        seq.stop_reason = pb.STOP_REASON_STOP if reason == "stop" else pb.STOP_REASON_LENGTH
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, np.float32).tobytes()
    return msg.SerializeToString()
