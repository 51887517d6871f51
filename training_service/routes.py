"""The Tinker HTTP API's routes: the client's set-up, sessions, models, training,
sampling and futures, and StreamRL's own sampler-weights download. Each route checks the
caller owns what it names (training_service/access.py), records the request in the
store, and answers with a future the executor resolves."""

from __future__ import annotations

import io
import json
import math
import tarfile
import uuid
from pathlib import Path

import anyio
import pydantic
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from tinker import types

from streamrl.training_service.access import Service, caller, parse, service_of
from streamrl.training_service.limits import too_large
from streamrl.training_service.names import checkpoint_name
from streamrl.training_service.wire import PROTO_CONTENT_TYPE, decode_forward_backward, plain_body

LONG_POLL_S = 10.0
# Feature flags the client asks for first: API keys, not JWT exchange; httpx's own transport.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False}

# The request bodies the routes read themselves (the client's own types), declared in the
# OpenAPI document so that a schema-driven client (or fuzzer) can build them; the
# models they refer to go to its components (training_service/app.py adds them).
BODY_SCHEMAS: dict[str, dict] = {}
PROTOBUF_BODY = {
    "requestBody": {"required": True, "content": {PROTO_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}}
}


def json_body(model: type[pydantic.BaseModel]) -> dict:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    BODY_SCHEMAS.update(schema.pop("$defs", {}))
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


router = APIRouter(prefix="/api/v1")
streamrl_router = APIRouter(prefix="/streamrl/v1")


# --- the client's set-up --------------------------------------------------------------------
@router.get("/healthz")
def healthz():
    return {"status": "ok"}


@router.post("/client/config")
def client_config(key_id: str = Depends(caller)):
    return CLIENT_CONFIG


@router.post("/client/dynamic_config")
def client_dynamic_config(key_id: str = Depends(caller)):
    return {}


@router.post("/telemetry")
def telemetry(key_id: str = Depends(caller)):
    return {"status": "accepted"}


@router.get("/get_server_capabilities")
def capabilities(key_id: str = Depends(caller), service: Service = Depends(service_of)):
    return {
        "supported_models": [{"model_name": name, "trainable": True, "sampleable": True} for name in service.executor.base_models]
    }


@router.post("/create_session", openapi_extra=json_body(types.CreateSessionRequest))
async def create_session(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body = parse(types.CreateSessionRequest, await request.body())
    service.admit(key_id, "session")
    session_id = "session-" + uuid.uuid4().hex[:12]
    service.store.add_session(session_id, key_id, body.sdk_version, body.user_metadata)
    return {"type": "create_session", "session_id": session_id}


@router.post("/session_heartbeat")
def heartbeat(key_id: str = Depends(caller)):
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
def finish_session(session_id: str, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    if service.access.owner(session_id) == key_id:
        service.store.finish_session(session_id)
        service.executor.release(session_id)  # its models leave memory (a restart would not load them either)
    return Response(status_code=200)


# --- models ------------------------------------------------------------------------------------
@router.post("/create_model", openapi_extra=json_body(types.CreateModelRequest))
async def create_model(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body = parse(types.CreateModelRequest, await request.body())
    service.access.own_session(body.session_id, key_id)
    service.admit(key_id, "model")
    base_models = service.executor.base_models
    if body.base_model not in base_models:
        raise HTTPException(400, f"base_model: {body.base_model!r} is not served here; served: {', '.join(base_models)}")
    model_id = f"{body.session_id}:train:{body.model_seq_id}"
    # rank 0: full fine-tuning (the official client always sends a LoraConfig)
    lora = body.lora_config.model_dump() if body.lora_config and body.lora_config.rank > 0 else None
    service.store.add_model(
        model_id=model_id,
        session_id=body.session_id,
        base_model=body.base_model,
        lora=lora,
        lora_rank=lora["rank"] if lora else None,
        seed=lora.get("seed") if lora else None,
    )
    service.store.accept(model_id + ":0", "create_model", body.model_dump_json().encode(), model_id, 0)
    service.executor.track(model_id)
    return service.future(model_id + ":0", model_id)


@router.post("/get_info", openapi_extra=json_body(types.GetInfoRequest))
async def get_info(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body = parse(types.GetInfoRequest, await request.body())
    row = service.access.own_model(body.model_id, key_id)
    return {
        "type": "get_info",
        "model_id": body.model_id,
        "is_lora": row["lora_rank"] is not None,
        "lora_rank": row["lora_rank"],
        "model_data": {
            "arch": "causal_lm",
            "model_name": row["base_model"],
            "tokenizer_id": service.executor.base_models[row["base_model"]],
        },
    }


@router.post("/load_weights", openapi_extra=json_body(types.LoadWeightsRequest))
async def load_weights(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body = parse(types.LoadWeightsRequest, await request.body())
    store, access = service.store, service.access
    checkpoint = store.checkpoint(body.path)
    if checkpoint is None or checkpoint["kind"] != "state":
        raise HTTPException(400, f"path: {body.path!r} is not a state saved on this service")
    source = access.own_model(checkpoint["model_id"], key_id)
    if body.model_id is None:  # a new training client from the state
        access.own_session(body.session_id, key_id)
        service.admit(key_id, "model")
        model_id, seq = f"{body.session_id}:train:{body.model_seq_id}", 0
        store.add_model(
            model_id=model_id,
            session_id=body.session_id,
            base_model=source["base_model"],
            lora=source["lora"],
            lora_rank=source["lora_rank"],
            seed=source["seed"],
            loaded_from=body.path,
        )
        service.executor.track(model_id)
    else:
        access.own_model(body.model_id, key_id)
        service.admit(key_id)
        model_id, seq = body.model_id, body.seq_id
    store.accept(f"{model_id}:{seq}", "load_weights", body.model_dump_json().encode(), model_id, seq)
    return service.future(f"{model_id}:{seq}", model_id)


# --- training -------------------------------------------------------------------------------------
@router.post("/forward_backward", openapi_extra=PROTOBUF_BODY)
async def forward_backward(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body, encoding = await request.body(), request.headers.get("content-encoding")

    def decode():
        plain = plain_body(body, encoding, service.limits)
        return plain, decode_forward_backward(plain, service.limits)

    # off the event loop (every tenant's requests wait on it), at most DECODERS at once
    plain, decoded = await anyio.to_thread.run_sync(decode, limiter=service.decoders())
    service.access.own_model(decoded.model_id, key_id)
    service.admit(key_id)
    request_id = f"{decoded.model_id}:{decoded.seq_id}"
    service.store.accept(request_id, "forward_backward", plain, decoded.model_id, decoded.seq_id)
    return service.future(request_id, decoded.model_id)


async def accept_sequenced(kind: str, model: type[pydantic.BaseModel], request: Request, key_id: str, service: Service) -> dict:
    """A request that runs in its model's sequence order (`seq_id`), recorded as `kind`."""
    body = parse(model, await request.body())
    service.access.own_model(body.model_id, key_id)
    service.admit(key_id)
    if body.seq_id is None:
        raise HTTPException(400, f"{model.__name__}.seq_id: required (requests run in their sequence order)")
    request_id = f"{body.model_id}:{body.seq_id}"
    if kind in ("save_weights", "save_weights_for_sampler"):
        checkpoint_name(body.path, f"{model.__name__}.path")  # before it is recorded: a restart replays it
    payload = json.loads(body.model_dump_json())
    if kind == "optim_step":
        payload = {"adam_params": body.optim_params.model_dump()}
    service.store.accept(request_id, kind, json.dumps(payload).encode(), body.model_id, body.seq_id)
    return service.future(request_id, body.model_id)


@router.post("/optim_step", openapi_extra=json_body(types.OptimStepRequest))
async def optim_step(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    return await accept_sequenced("optim_step", types.OptimStepRequest, request, key_id, service)


@router.post("/save_weights", openapi_extra=json_body(types.SaveWeightsRequest))
async def save_weights(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    return await accept_sequenced("save_weights", types.SaveWeightsRequest, request, key_id, service)


@router.post("/save_weights_for_sampler", openapi_extra=json_body(types.SaveWeightsForSamplerRequest))
async def save_weights_for_sampler(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    return await accept_sequenced("save_weights_for_sampler", types.SaveWeightsForSamplerRequest, request, key_id, service)


# --- sampling ------------------------------------------------------------------------------------------
def sampler_folder(service: Service, model_path: str | None, base_model: str | None, key_id: str) -> tuple[str, str]:
    """(folder, base model name) of what a sampling request samples from: the caller's own
    sampler weights, or a served base model."""
    if model_path:
        checkpoint = service.store.checkpoint(model_path)
        if checkpoint is None or checkpoint["kind"] != "sampler":
            raise HTTPException(400, f"model_path: {model_path!r} is not sampler weights saved on this service")
        try:
            row = service.access.own_model(checkpoint["model_id"], key_id)
        except HTTPException:
            raise HTTPException(400, f"model_path: {model_path!r} is not sampler weights saved on this service") from None
        return checkpoint["folder"], row["base_model"]
    if base_model not in service.executor.base_models:
        raise HTTPException(400, f"base_model: {base_model!r} is not served here")
    return service.executor.base_models[base_model], base_model


def sampling_session(service: Service, sampling_session_id: str, key_id: str) -> dict:
    service.access.own_sampling_session(sampling_session_id, key_id)
    session = service.store.request(sampling_session_id)
    if session is None or session["kind"] != "sampling_session":
        raise HTTPException(404, f"sampling_session_id: no session {sampling_session_id!r}")
    return session


@router.get("/samplers/{sampling_session_id}")
def sampler(sampling_session_id: str, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    payload = json.loads(sampling_session(service, sampling_session_id, key_id)["payload"])
    return {"sampler_id": sampling_session_id, "base_model": payload["base_model"], "model_path": payload.get("model_path")}


@router.post("/create_sampling_session", openapi_extra=json_body(types.CreateSamplingSessionRequest))
async def create_sampling_session(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body = parse(types.CreateSamplingSessionRequest, await request.body())
    service.access.own_session(body.session_id, key_id)
    session = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
    folder, base_model = sampler_folder(service, body.model_path, body.base_model, key_id)
    service.store.add_sampling_session(session, folder, base_model, body.model_path)
    return {"type": "create_sampling_session", "sampling_session_id": session}


UNSERVED_SAMPLE_OPTIONS = (
    "topk_prompt_logprobs",
    "topk_sample_logprobs",
    "target_prompt_logprobs",
    "prompt_alt_tokens_k",
    "prompt_logprobs_last_n",
    "record_stability_info",
)


@router.post("/asample", openapi_extra=json_body(types.SampleRequest))
async def asample(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body = parse(types.SampleRequest, await request.body())
    unserved = [name for name in UNSERVED_SAMPLE_OPTIONS if getattr(body, name) not in (None, 0, False)]
    if unserved:
        raise HTTPException(400, f"SampleRequest.{unserved[0]}: not served by streamrl serve-training")
    if any(getattr(chunk, "type", None) != "encoded_text" for chunk in body.prompt.chunks):
        raise HTTPException(400, "SampleRequest.prompt: only text (token) chunks are served")
    if body.sampling_session_id:
        folder = json.loads(sampling_session(service, body.sampling_session_id, key_id)["payload"])["folder"]
    else:
        folder, _ = sampler_folder(service, body.model_path, body.base_model, key_id)
    check_sampling_params(body, service.limits)
    check_sample_size(body, service.limits)
    service.admit(key_id)
    payload = {**json.loads(body.model_dump_json()), "folder": folder, "key_id": key_id}
    request_id = f"sample-{key_id}-{uuid.uuid4().hex}"  # the key in the id: its pending requests are counted
    service.store.accept(request_id, "sample", json.dumps(payload).encode())
    return service.future(request_id, sample_sequence_ids=[f"{request_id}:{i}" for i in range(body.num_samples)])


MAX_STOP_ENTRIES, MAX_STOP_CHARS = 16, 256  # each stop string is searched for after every sampled token


def check_sampling_params(body: types.SampleRequest, limits) -> None:
    """Sampling parameters that would fail later as a server error, sample something other
    than asked (max_tokens 0 sampled 64 tokens), or multiply the shared sampler's work:
    a 400 naming the field, before the request is recorded."""
    params, where = body.sampling_params, "SampleRequest.sampling_params"
    problems = []
    if body.num_samples < 1:
        problems.append(f"SampleRequest.num_samples: at least 1, got {body.num_samples}")
    if params.max_tokens is not None and not 1 <= params.max_tokens <= limits.max_new_tokens:
        problems.append(f"{where}.max_tokens: from 1 to {limits.max_new_tokens} (max_new_tokens), got {params.max_tokens}")
    if not (math.isfinite(params.temperature) and params.temperature >= 0):
        problems.append(f"{where}.temperature: a number of at least 0, got {params.temperature}")
    if not (math.isfinite(params.top_p) and 0 < params.top_p <= 1):
        problems.append(f"{where}.top_p: in (0, 1], got {params.top_p}")
    if params.top_k != -1 and params.top_k < 1:
        problems.append(f"{where}.top_k: -1 (off) or at least 1, got {params.top_k}")
    if params.seed is not None and params.seed < 0:
        problems.append(f"{where}.seed: at least 0, got {params.seed}")
    stops = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
    if len(stops) > MAX_STOP_ENTRIES or any(isinstance(s, str) and len(s) > MAX_STOP_CHARS for s in stops):
        problems.append(f"{where}.stop: at most {MAX_STOP_ENTRIES} entries of at most {MAX_STOP_CHARS} characters")
    if problems:
        raise HTTPException(400, "; ".join(problems))


def check_sample_size(body: types.SampleRequest, limits) -> None:
    """Sequences and tokens of one sample request, bounded before it is recorded."""
    if body.num_samples > limits.max_sample_sequences:
        raise too_large("SampleRequest.num_samples", body.num_samples, "max_sample_sequences", limits.max_sample_sequences)
    prompt = sum(len(getattr(chunk, "tokens", []) or []) for chunk in body.prompt.chunks)
    tokens = body.num_samples * (prompt + (body.sampling_params.max_tokens or 0))
    if tokens > limits.max_sample_tokens:
        raise too_large(
            "SampleRequest (num_samples x (prompt + max_tokens))", tokens, "max_sample_tokens", limits.max_sample_tokens
        )


# --- futures --------------------------------------------------------------------------------------------
def owns_request(service: Service, row: dict, key_id: str) -> bool:
    """A model's request by the model's owner; a sample request by the key that made it."""
    try:
        if row["model_id"]:
            service.access.own_model(row["model_id"], key_id)
            return True
    except HTTPException:
        return False
    try:
        return json.loads(row["payload"] or b"{}").get("key_id") == key_id
    except (ValueError, AttributeError):
        return False


@router.post("/retrieve_future", openapi_extra=json_body(types.FutureRetrieveRequest))
async def retrieve_future(request: Request, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    body = parse(types.FutureRetrieveRequest, await request.body())
    row = service.store.request(body.request_id)
    if row is None or not owns_request(service, row, key_id):
        raise HTTPException(404, f"request_id: no request {body.request_id!r} for this API key")
    if row["status"] == "pending":
        with service.long_poll(key_id):
            await service.executor.wait(body.request_id, LONG_POLL_S)
        row = service.store.request(body.request_id)
        if row is None:  # requests are kept once accepted
            raise HTTPException(404, f"request_id: no request {body.request_id!r} for this API key")
    if row["status"] == "pending":
        return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
    if row["status"] == "failed":
        return {"error": row["error"], "category": row["error_category"] or "unknown"}
    if row["result_format"] == "proto":
        return Response(row["result"], media_type=PROTO_CONTENT_TYPE)
    return Response(row["result"] or b"null", media_type="application/json")


# --- StreamRL's own: sampler weights as a tar, for engines on other machines -----------------------------
@streamrl_router.get("/sampler_weights")
def sampler_weights(path: str, key_id: str = Depends(caller), service: Service = Depends(service_of)):
    checkpoint = service.store.checkpoint(path)
    if checkpoint is None or checkpoint["kind"] != "sampler":
        raise HTTPException(404, f"path: no sampler weights {path!r}")
    service.access.own_model(checkpoint["model_id"], key_id)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for file in sorted(Path(checkpoint["folder"]).iterdir()):
            tar.add(file, arcname=file.name)
    buffer.seek(0)
    return StreamingResponse(buffer, media_type="application/x-tar")
