"""One tenant of `streamrl serve-training` against the others, and against the service:
each test is an attack from the security issue's second round (findings 7, 8, 10, 11,
14, 15, 16) that worked before the bound it checks. Raw HTTP where the official client
would not send such a thing; the official `tinker` client where a user would."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import psutil
import pytest
import zstandard
from tinker.proto import tinker_public_pb2 as pb

from streamrl.runtime import db
from streamrl.runtime.http_server import BODY_IDLE_S, HEAD_S
from streamrl.runtime.tiny_lm import build_tiny_model
from tests.conftest import free_port, fresh_database, run_cli, start_serve_training, wait_for
from tests.test_rl_loop import scalar

PORT = free_port()
URL = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def service_env(stack):
    return {"STREAMRL_DATABASE_URL": fresh_database(stack, "tenants")}


@pytest.fixture(scope="module")
def service(service_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("tenants")
    model = build_tiny_model(root / "tiny")
    log = root / "serve-training.log"
    process = start_serve_training(
        "--model", f"tiny={model}", "--root", str(root / "service"), port=PORT, env=service_env, log=log
    )
    yield {"process": process, "root": root / "service", "log": log}
    process.kill()
    process.wait()


@pytest.fixture
def ledger(service_env):
    conn = db.connect(service_env["STREAMRL_DATABASE_URL"], autocommit=True)
    yield conn
    conn.close()


def new_key(service_env, name: str) -> str:
    return run_cli("training-key", "create", name, env=service_env, check=True).stdout.split()[1]


@pytest.fixture(scope="module")
def victim(service, service_env) -> str:
    return new_key(service_env, "victim")


@pytest.fixture(scope="module")
def attacker(service, service_env) -> str:
    return new_key(service_env, "attacker")


def rss(service) -> int:
    return psutil.Process(service["process"].pid).memory_info().rss


def victims_call_s(key: str) -> float:
    """How long the other tenant waits for a call that needs a thread of the server's pool."""
    started = time.monotonic()
    response = httpx.post(f"{URL}/api/v1/client/config", headers={"X-API-Key": key}, timeout=60)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def zstd_bomb(size: int) -> bytes:
    """`size` zero bytes, compressed without declaring their size (a streamed frame)."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as writer:
        for _ in range(size // (16 << 20)):
            writer.write(bytes(16 << 20))
    return out.getvalue()


def test_unknown_session_ids_cost_the_service_nothing(service, attacker):
    """Finding 8: the owner of every session id asked for was remembered, found or not:
    about 1 MiB kept per 404 for a 1 MiB id. (First in the module: memory another test
    freed would hide the growth.)"""
    before = rss(service)
    for number in range(100):
        session_id = f"{number:04d}".encode() + b"s" * (1 << 20)  # a new id each time
        body = b'{"session_id": "' + session_id + b'", "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 2}}'
        response = httpx.post(f"{URL}/api/v1/create_model", content=body, headers={"X-API-Key": attacker}, timeout=60)
        assert response.status_code == 404, response.text
    assert rss(service) - before < 50 << 20  # 100 MiB before


def test_small_compressed_uploads_neither_stall_other_tenants_nor_keep_memory(service, victim, attacker):
    """Finding 7: a 36 KB upload blocked every tenant for 19 s and kept 2 GB: its
    decompression and parsing ran on the event loop, to 512 MiB. Now on two threads, to
    64 MiB (a whole request at the token limit is about 25 MiB).

    The bound is 2 s over the slowest of the same calls made just before the uploads, so
    that the machine's own load (CI runs two tests at once) is not counted as a stall
    (docs/benchmarks.md, "Bounds under load")."""
    bomb = zstd_bomb(1 << 30)
    assert len(bomb) < 200_000
    before = rss(service)
    headers = {"X-API-Key": attacker, "Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"}

    def upload(_) -> tuple[int, float]:
        status = httpx.post(f"{URL}/api/v1/forward_backward", content=bomb, headers=headers, timeout=120).status_code
        return status, time.monotonic() - started

    alone = max(victims_call_s(victim) for _ in range(5))
    cpu_before, started = psutil.Process(service["process"].pid).cpu_times(), time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = pool.map(upload, range(8))  # all eight sent now; their answers read after the calls below
        waits = [victims_call_s(victim) for _ in range(5)]
        uploads = list(answers)
    assert {status for status, _ in uploads} == {413}
    cpu = psutil.Process(service["process"].pid).cpu_times()
    # what a failure needs to be told apart from the machine's load (docs/benchmarks.md, "Bounds under load")
    seen = (
        f"the other tenant's calls {[round(w, 2) for w in waits]} s, before the uploads at most {alone:.2f} s; "
        f"uploads answered after {sorted(round(at, 2) for _, at in uploads)} s; the service's CPU in that time "
        f"{cpu.user - cpu_before.user:.2f} s user, {cpu.system - cpu_before.system:.2f} s system; "
        f"load average {os.getloadavg()}"
    )
    assert max(waits) < 2.0 + alone, seen
    assert rss(service) - before < 512 << 20


def open_connections(service) -> int:
    connections = psutil.Process(service["process"].pid).net_connections("tcp")
    return sum(1 for c in connections if c.laddr.port == PORT and c.status == psutil.CONN_ESTABLISHED)


def pending_forever(key: str, tinker_clients) -> tuple[str, str]:
    """(model id, request id) of a forward_backward that waits for a sequence number the
    client never sends: it stays pending."""
    model_id = tinker_clients(URL, key).create_lora_training_client(base_model="tiny", rank=2).result().model_id
    msg = pb.ForwardBackwardRequest(model_id=model_id, seq_id=500, loss_fn="cross_entropy")
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = np.full(4, 5, np.int32).tobytes()
    target = datum.loss_fn_inputs["target_tokens"]
    target.dtype, target.dense = pb.DTYPE_INT64, np.full(4, 6, np.int64).tobytes()
    response = httpx.post(
        f"{URL}/api/v1/forward_backward",
        content=msg.SerializeToString(),
        headers={"X-API-Key": key, "Content-Type": "application/x-protobuf"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return model_id, response.json()["request_id"]


def test_one_keys_open_long_polls_do_not_slow_the_others(service, victim, attacker, tinker_clients):
    """Finding 10: 60 open long-polls from one key held 60 threads of the server's pool,
    and every other tenant's calls took 8.9 s. A long-poll now waits on an event."""
    _, request_id = pending_forever(attacker, tinker_clients)

    async def poll(client) -> tuple[httpx.Response, float]:
        answer = await client.post(
            f"{URL}/api/v1/retrieve_future", json={"request_id": request_id}, headers={"X-API-Key": attacker}
        )
        return answer, time.monotonic()

    async def polls():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(poll(client) for _ in range(60)))

    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(asyncio.run, polls())
        wait_for(lambda: open_connections(service) >= 60, timeout=30, what="60 open long-polls")  # each waits 10 s
        waits = [victims_call_s(victim) for _ in range(5)]
        victims_done = time.monotonic()
        answered = polling.result()
    assert {answer.json()["type"] for answer, _ in answered} == {"try_again"}
    # An order, not a time limit (which a loaded machine overran: 1.23 s against 1.0): the
    # other tenant's five calls all end while every long-poll still waits. With the
    # threads held, its first call could end only after a long-poll had answered.
    first_answer = min(at for _, at in answered)
    assert victims_done < first_answer, f"the other tenant's calls ({waits} s) ended after a long-poll answered"


def test_half_sent_requests_are_closed(service, attacker):
    """Finding 11: 0 of 300 slow connections were closed. A request's head must arrive
    within HEAD_S, its body without a pause of BODY_IDLE_S. The service says nothing of
    them: each closed body read printed a 4.6 KB traceback, and a service whose output went
    to a pipe nobody read stopped once it was full (2026-12-07)."""
    said_before = service["log"].stat().st_size
    head = b"POST /api/v1/create_session HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head_only = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(20)]
    for connection in head_only:
        connection.sendall(head)
    part_body = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(20)]
    for connection in part_body:  # with a valid key: the route waits for the body
        connection.sendall(head + f"X-API-Key: {attacker}\r\nContent-Length: 1000\r\n\r\n{{".encode())
    started = time.monotonic()
    limit = max(HEAD_S, BODY_IDLE_S) + 5
    for connection in head_only + part_body:
        connection.settimeout(limit + 5)
        assert connection.recv(1) == b""  # closed by the server (a timeout here raises)
        connection.close()
    assert time.monotonic() - started < limit
    # the routes that waited for those bodies ended before these requests are answered:
    # the server closed each connection after waking its route (one event loop, in order)
    for _ in range(3):
        assert httpx.get(f"{URL}/api/v1/healthz", timeout=30).status_code == 200
    with open(service["log"], "rb") as log:
        log.seek(said_before)
        said = log.read().decode(errors="replace")
    assert "Traceback" not in said and "ClientDisconnect" not in said, said[-3000:]


def test_sampler_weights_saved_again_under_a_name_serve_what_was_saved_last(service, victim, tinker_clients):
    """Finding 14: the sampler cached a folder by its name, so weights saved again under
    the same name kept sampling the old ones."""
    from tinker import types

    client = tinker_clients(URL, victim)
    trainer = client.create_lora_training_client(base_model="tiny", rank=4).result()
    prompt = types.ModelInput.from_ints([5, 6, 7, 8])
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=11)

    def logprobs(name: str) -> list[float]:
        path = trainer.save_weights_for_sampler(name=name).result().path
        sampler = client.create_sampling_client(model_path=path)
        return sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result().sequences[0].logprobs

    first = logprobs("same")
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 8, 9, 10]),
        loss_fn_inputs={"target_tokens": np.array([6, 7, 8, 9, 10, 11], np.int64)},
    )
    for _ in range(3):
        trainer.forward_backward([datum], "cross_entropy")
        trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    again, fresh = logprobs("same"), logprobs("other")
    assert again != first
    assert again == fresh  # the same weights and seed as a save under a new name


def test_a_revoked_key_stops_at_once_with_its_work(service, service_env, ledger, tinker_clients):
    """Finding 15: a revoked key worked for up to 4 s, what it had queued still ran, and
    its models stayed loaded and were restored after restarts."""
    key = new_key(service_env, "to-revoke")
    model_id, request_id = pending_forever(key, tinker_clients)
    key_id = scalar(ledger, "select key_id from service_api_keys where name = 'to-revoke'")
    run_cli("training-key", "revoke", key_id, env=service_env, check=True)
    response = httpx.post(f"{URL}/api/v1/client/config", headers={"X-API-Key": key}, timeout=30)
    assert response.status_code == 401  # at once: no sleep between the revocation and this call
    assert scalar(ledger, "select status || ': ' || error from service_requests where request_id = %s", request_id) == (
        "failed: the API key was revoked"
    )
    session = model_id.split(":")[0]
    assert scalar(ledger, "select status from service_sessions where session_id = %s", session) == "finished"
    restorable = "select count(*) from service_models m join service_sessions s using (session_id) where s.status = 'active'"
    assert scalar(ledger, restorable + " and m.model_id = %s", model_id) == 0  # a restart does not load it


def test_error_texts_name_no_server_path(service, victim, tinker_clients, ledger):
    """Finding 16: a failed request's error carried the service's own folders."""
    client = tinker_clients(URL, victim)
    trainer = client.create_lora_training_client(base_model="tiny", rank=2).result()
    state = trainer.save_state("to-lose").result().path
    folder = scalar(ledger, "select folder from service_checkpoints where path = %s", state)
    shutil.rmtree(folder)
    with pytest.raises(Exception) as failure:
        client.create_training_client_from_state(state).result()
    error = scalar(ledger, "select error from service_requests where kind = 'load_weights' and status = 'failed' limit 1")
    assert "<server path>" in error and str(service["root"]) not in error and str(service["root"]) not in str(failure.value)
