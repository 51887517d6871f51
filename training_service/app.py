"""`streamrl serve-training`: StreamRL's learner behind the Tinker HTTP API.

The official `tinker` client talks to it unchanged (`tinker.ServiceClient(base_url=...)`):
sessions, LoRA or full fine-tuning models, forward_backward / optim_step /
save_state / load_state / save_weights_for_sampler / sample, all as futures. Requests
are recorded in PostgreSQL before they are answered (training_service/store.py) and run
by the executor; `retrieve_future` long-polls for their outcome. Every endpoint but
`healthz` needs an API key (`X-API-Key`, created by `streamrl training-key create NAME`).
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import uuid
from pathlib import Path

import pydantic
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from tinker import types

from training_service.executor import Executor
from training_service.store import ServiceStore
from training_service.wire import PROTO_CONTENT_TYPE, WireError, decode_forward_backward, plain_body

LONG_POLL_S = 10.0
KEY_RECHECK_S = 5.0
# Feature flags the client asks for first: API keys, not JWT exchange; httpx's own transport.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False}


def build_app(store: ServiceStore, executor: Executor) -> FastAPI:
    app = FastAPI(title="StreamRL training service", docs_url=None, redoc_url=None)
    known_keys: dict[str, tuple[str, float]] = {}  # key -> (key id, when checked): a revoked key stops in seconds

    def caller(x_api_key: str | None = Header(default=None)) -> str:
        if not x_api_key:
            raise HTTPException(401, "an API key is required (X-API-Key; `streamrl training-key create NAME`)")
        known = known_keys.get(x_api_key)
        if known is None or time.monotonic() - known[1] > KEY_RECHECK_S:
            key_id = store.key_id_for(x_api_key)
            if key_id is None:
                known_keys.pop(x_api_key, None)
                raise HTTPException(401, "the API key is not valid")
            known = known_keys[x_api_key] = (key_id, time.monotonic())
        return known[0]

    def parse(model: type[pydantic.BaseModel], body: bytes):
        try:
            return model.model_validate_json(body)
        except pydantic.ValidationError as error:
            fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5])
            raise HTTPException(400, f"{model.__name__}: {fields}") from None

    owners: dict[str, str | None] = {}  # session -> its key id (never changes): one query per session

    def owner(session_id: str) -> str | None:
        if session_id not in owners:
            owners[session_id] = store.session_key(session_id)
        return owners[session_id]

    def own_session(session_id: str, key_id: str) -> None:
        if owner(session_id) != key_id:
            raise HTTPException(404, f"session_id: no session {session_id!r} for this API key")

    def own_model(model_id: str, key_id: str) -> dict:
        row = store.model(model_id)
        if row is None:
            raise HTTPException(404, f"model_id: no model {model_id!r} on this service")
        if owner(row["session_id"]) != key_id:
            raise HTTPException(403, f"model {model_id} belongs to another API key")
        return row

    def future(request_id: str, model_id: str | None = None, **extra) -> dict:
        executor.notify()
        return {"request_id": request_id, "model_id": model_id, **extra}

    @app.exception_handler(WireError)
    def wire_error(request: Request, error: WireError):
        return JSONResponse({"detail": str(error)}, status_code=400)

    # --- the client's set-up --------------------------------------------------------------------
    @app.get("/api/v1/healthz")
    def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    def client_config(key_id: str = Depends(caller)):
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    def client_dynamic_config(key_id: str = Depends(caller)):
        return {}

    @app.post("/api/v1/telemetry")
    def telemetry(key_id: str = Depends(caller)):
        return {"status": "accepted"}

    @app.get("/api/v1/get_server_capabilities")
    def capabilities(key_id: str = Depends(caller)):
        return {"supported_models": [{"model_name": name, "trainable": True, "sampleable": True}
                                     for name in executor.base_models]}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request, key_id: str = Depends(caller)):
        body = parse(types.CreateSessionRequest, await request.body())
        session_id = "session-" + uuid.uuid4().hex[:12]
        store.add_session(session_id, key_id, body.sdk_version, body.user_metadata)
        return {"type": "create_session", "session_id": session_id}

    @app.post("/api/v1/session_heartbeat")
    def heartbeat(key_id: str = Depends(caller)):
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    def finish_session(session_id: str, key_id: str = Depends(caller)):
        if owner(session_id) == key_id:
            store.finish_session(session_id)
            executor.release(session_id)  # its models leave memory (a restart would not load them either)
        return Response(status_code=200)

    # --- models ------------------------------------------------------------------------------------
    @app.post("/api/v1/create_model")
    async def create_model(request: Request, key_id: str = Depends(caller)):
        body = parse(types.CreateModelRequest, await request.body())
        own_session(body.session_id, key_id)
        if body.base_model not in executor.base_models:
            raise HTTPException(400, f"base_model: {body.base_model!r} is not served here; served: "
                                     f"{', '.join(executor.base_models)}")
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        # rank 0: full fine-tuning (the official client always sends a LoraConfig)
        lora = body.lora_config.model_dump() if body.lora_config and body.lora_config.rank > 0 else None
        store.add_model(model_id=model_id, session_id=body.session_id, base_model=body.base_model, lora=lora,
                        lora_rank=lora["rank"] if lora else None, seed=lora.get("seed") if lora else None)
        store.accept(model_id + ":0", "create_model", body.model_dump_json().encode(), model_id, 0)
        executor.track(model_id)
        return future(model_id + ":0", model_id)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request, key_id: str = Depends(caller)):
        body = parse(types.GetInfoRequest, await request.body())
        row = own_model(body.model_id, key_id)
        return {"type": "get_info", "model_id": body.model_id, "is_lora": row["lora_rank"] is not None,
                "lora_rank": row["lora_rank"],
                "model_data": {"arch": "causal_lm", "model_name": row["base_model"],
                               "tokenizer_id": executor.base_models[row["base_model"]]}}

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request, key_id: str = Depends(caller)):
        body = parse(types.LoadWeightsRequest, await request.body())
        checkpoint = store.checkpoint(body.path)
        if checkpoint is None or checkpoint["kind"] != "state":
            raise HTTPException(400, f"path: {body.path!r} is not a state saved on this service")
        source = own_model(checkpoint["model_id"], key_id)
        if body.model_id is None:  # a new training client from the state
            own_session(body.session_id, key_id)
            model_id, seq = f"{body.session_id}:train:{body.model_seq_id}", 0
            store.add_model(model_id=model_id, session_id=body.session_id, base_model=source["base_model"],
                            lora=source["lora"], lora_rank=source["lora_rank"], seed=source["seed"],
                            loaded_from=body.path)
            executor.track(model_id)
        else:
            own_model(body.model_id, key_id)
            model_id, seq = body.model_id, body.seq_id
        store.accept(f"{model_id}:{seq}", "load_weights", body.model_dump_json().encode(), model_id, seq)
        return future(f"{model_id}:{seq}", model_id)

    # --- training -------------------------------------------------------------------------------------
    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request, key_id: str = Depends(caller)):
        plain = plain_body(await request.body(), request.headers.get("content-encoding"))
        decoded = decode_forward_backward(plain)
        own_model(decoded.model_id, key_id)
        request_id = f"{decoded.model_id}:{decoded.seq_id}"
        store.accept(request_id, "forward_backward", plain, decoded.model_id, decoded.seq_id)
        return future(request_id, decoded.model_id)

    def sequenced(kind: str, model: type[pydantic.BaseModel]):
        async def endpoint(request: Request, key_id: str = Depends(caller)):
            body = parse(model, await request.body())
            own_model(body.model_id, key_id)
            if body.seq_id is None:
                raise HTTPException(400, f"{model.__name__}.seq_id: required (requests run in their sequence order)")
            request_id = f"{body.model_id}:{body.seq_id}"
            payload = json.loads(body.model_dump_json())
            if kind == "optim_step":
                payload = {"adam_params": body.optim_params.model_dump()}
            store.accept(request_id, kind, json.dumps(payload).encode(), body.model_id, body.seq_id)
            return future(request_id, body.model_id)
        app.post(f"/api/v1/{kind}")(endpoint)

    sequenced("optim_step", types.OptimStepRequest)
    sequenced("save_weights", types.SaveWeightsRequest)
    sequenced("save_weights_for_sampler", types.SaveWeightsForSamplerRequest)

    # --- sampling ------------------------------------------------------------------------------------------
    def sampler_folder(model_path: str | None, base_model: str | None) -> tuple[str, str]:
        """(folder, base model name) of what a sampling request samples from."""
        if model_path:
            checkpoint = store.checkpoint(model_path)
            if checkpoint is None or checkpoint["kind"] != "sampler":
                raise HTTPException(400, f"model_path: {model_path!r} is not sampler weights saved on this service")
            return checkpoint["folder"], store.model(checkpoint["model_id"])["base_model"]
        if base_model not in executor.base_models:
            raise HTTPException(400, f"base_model: {base_model!r} is not served here")
        return executor.base_models[base_model], base_model

    @app.get("/api/v1/samplers/{sampling_session_id}")
    def sampler(sampling_session_id: str, key_id: str = Depends(caller)):
        payload = json.loads(sampling_session(sampling_session_id)["payload"])
        return {"sampler_id": sampling_session_id, "base_model": payload["base_model"],
                "model_path": payload.get("model_path")}

    def sampling_session(sampling_session_id: str) -> dict:
        session = store.request(sampling_session_id)
        if session is None or session["kind"] != "sampling_session":
            raise HTTPException(404, f"sampling_session_id: no session {sampling_session_id!r}")
        return session

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request, key_id: str = Depends(caller)):
        body = parse(types.CreateSamplingSessionRequest, await request.body())
        own_session(body.session_id, key_id)
        session = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
        folder, base_model = sampler_folder(body.model_path, body.base_model)
        store.add_sampling_session(session, folder, base_model, body.model_path)
        return {"type": "create_sampling_session", "sampling_session_id": session}

    @app.post("/api/v1/asample")
    async def asample(request: Request, key_id: str = Depends(caller)):
        body = parse(types.SampleRequest, await request.body())
        unserved = [name for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "target_prompt_logprobs",
                                      "prompt_alt_tokens_k", "prompt_logprobs_last_n", "record_stability_info")
                    if getattr(body, name) not in (None, 0, False)]
        if unserved:
            raise HTTPException(400, f"SampleRequest.{unserved[0]}: not served by streamrl serve-training")
        if any(getattr(chunk, "type", None) != "encoded_text" for chunk in body.prompt.chunks):
            raise HTTPException(400, "SampleRequest.prompt: only text (token) chunks are served")
        if body.sampling_session_id:
            folder = json.loads(sampling_session(body.sampling_session_id)["payload"])["folder"]
        else:
            folder, _ = sampler_folder(body.model_path, body.base_model)
        payload = {**json.loads(body.model_dump_json()), "folder": folder}
        request_id = "sample-" + uuid.uuid4().hex
        store.accept(request_id, "sample", json.dumps(payload).encode())
        return future(request_id, sample_sequence_ids=[f"{request_id}:{i}" for i in range(body.num_samples)])

    # --- futures --------------------------------------------------------------------------------------------
    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request, key_id: str = Depends(caller)):
        body = parse(types.FutureRetrieveRequest, await request.body())
        row = store.request(body.request_id)
        if row is None:
            raise HTTPException(404, f"request_id: no request {body.request_id!r} on this service")
        if row["model_id"]:
            own_model(row["model_id"], key_id)
        if row["status"] == "pending":
            import anyio
            await anyio.to_thread.run_sync(executor.wait, body.request_id, LONG_POLL_S)
            row = store.request(body.request_id)
        if row["status"] == "pending":
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        if row["status"] == "failed":
            return {"error": row["error"], "category": row["error_category"] or "unknown"}
        if row["result_format"] == "proto":
            return Response(row["result"], media_type=PROTO_CONTENT_TYPE)
        return Response(row["result"] or b"null", media_type="application/json")

    # --- StreamRL's own: sampler weights as a tar, for engines on other machines -----------------------------
    @app.get("/streamrl/v1/sampler_weights")
    def sampler_weights(path: str, key_id: str = Depends(caller)):
        checkpoint = store.checkpoint(path)
        if checkpoint is None or checkpoint["kind"] != "sampler":
            raise HTTPException(404, f"path: no sampler weights {path!r}")
        own_model(checkpoint["model_id"], key_id)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for file in sorted(Path(checkpoint["folder"]).iterdir()):
                tar.add(file, arcname=file.name)
        buffer.seek(0)
        return StreamingResponse(buffer, media_type="application/x-tar")

    return app

