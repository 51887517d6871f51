"""The training service's limits, probed as a hostile tenant would with raw HTTP: every
size a client chooses is refused (413 / 429, naming the limit) before it is allocated or
recorded, so neither memory nor the request ledger grows and a restart replays nothing (tested);
malformed bodies are 400s, never 500s."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import psutil
import pytest
import zstandard
from tinker.proto import tinker_public_pb2 as pb

from streamrl.runtime import db
from streamrl.runtime.tiny_lm import build_tiny_model
from tests.conftest import free_port, fresh_database, run_cli, start_serve_training
from tests.test_rl_loop import scalar

PORT = free_port()
URL = f"http://127.0.0.1:{PORT}"
LIMITS = {
    "max_body_bytes": 2 << 20,
    "max_decompressed_bytes": 8 << 20,
    "max_tokens_per_datum": 512,
    "max_tokens_per_request": 1024,
    "max_sample_sequences": 4,
    "max_sample_tokens": 256,
    "max_models_per_key": 2,
}


@pytest.fixture(scope="module")
def service_env(stack):
    """A ledger of this module's own (the service's sessions and requests)."""
    return {"STREAMRL_DATABASE_URL": fresh_database(stack, "limits")}


@pytest.fixture
def ledger(service_env):
    conn = db.connect(service_env["STREAMRL_DATABASE_URL"], autocommit=True)
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def service(service_env, tmp_path_factory):
    """The service's process (a test may restart it) and the arguments it was started with."""
    model = build_tiny_model(tmp_path_factory.mktemp("limits") / "tiny")
    limits = [arg for name, value in LIMITS.items() for arg in ("--limit", f"{name}={value}")]
    args = ["--model", f"tiny={model}", *limits]
    running = {"process": start_serve_training(*args, port=PORT, env=service_env), "args": args}
    yield running
    running["process"].kill()
    running["process"].wait()


@pytest.fixture(scope="module")
def key(service, service_env):
    return run_cli("training-key", "create", "limits", env=service_env, check=True).stdout.split()[1]


@pytest.fixture(scope="module")
def model_id(key, tinker_clients):
    return tinker_clients(URL, key).create_lora_training_client(base_model="tiny", rank=2).result().model_id


def forward_backward_body(model_id: str, tokens_per_datum: list[int], seq_id: int = 1) -> bytes:
    msg = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    for n in tokens_per_datum:
        datum = msg.data.add()
        datum.model_input.add().encoded_text.tokens = np.full(n, 5, np.int32).tobytes()
        target = datum.loss_fn_inputs["target_tokens"]
        target.dtype, target.dense = pb.DTYPE_INT64, np.full(n, 6, np.int64).tobytes()
    return msg.SerializeToString()


def post(path: str, key: str, body: bytes, **headers) -> httpx.Response:
    return httpx.post(
        f"{URL}/api/v1/{path}",
        content=body,
        timeout=60,
        headers={"X-API-Key": key, "Content-Type": "application/x-protobuf", **headers},
    )


def recorded(ledger, model_id: str) -> int:
    return scalar(ledger, "select count(*) from service_requests where model_id = %s", model_id)


def test_a_zstd_bomb_is_refused_without_the_memory_it_declares(service, key, model_id, ledger):
    bomb = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(bomb, closefd=False) as writer:
        zeros = bytes(16 << 20)
        for _ in range(64):  # 1 GiB of zeros
            writer.write(zeros)
    assert len(bomb.getvalue()) < 200_000
    before = psutil.Process(service["process"].pid).memory_info().rss
    response = post("forward_backward", key, bomb.getvalue(), **{"Content-Encoding": "zstd"})
    assert response.status_code == 413 and "max_decompressed_bytes (8388608)" in response.text
    assert psutil.Process(service["process"].pid).memory_info().rss - before < 100 << 20  # never near 1 GiB
    corrupt = post("forward_backward", key, b"\x28\xb5\x2f\xfd" + b"garbage" * 10, **{"Content-Encoding": "zstd"})
    assert corrupt.status_code == 400 and "not valid zstd" in corrupt.text
    assert recorded(ledger, model_id) == 1  # only create_model


def test_bodies_datums_and_requests_over_their_limits_are_not_recorded(service, service_env, key, model_id, ledger):
    too_big = post("forward_backward", key, bytes(3 << 20))
    assert too_big.status_code == 413 and "max_body_bytes" in too_big.text
    long_datum = post("forward_backward", key, forward_backward_body(model_id, [600]))
    assert (
        long_datum.status_code == 413 and "data[0].model_input: 600 is over the service's max_tokens_per_datum" in long_datum.text
    )
    many = post("forward_backward", key, forward_backward_body(model_id, [400, 400, 400]))
    assert many.status_code == 413 and "max_tokens_per_request (1024)" in many.text
    garbage = post("forward_backward", key, b"\xff\x00\x13 not a protobuf")
    assert garbage.status_code == 400
    assert recorded(ledger, model_id) == 1  # nothing of these: a restart has nothing to replay
    fits = post("forward_backward", key, forward_backward_body(model_id, [100, 100]))
    assert fits.status_code == 200, fits.text
    deadline = time.monotonic() + 120  # and it runs: the executor decodes what was accepted
    while time.monotonic() < deadline:
        done = httpx.post(
            f"{URL}/api/v1/retrieve_future",
            headers={"X-API-Key": key},
            timeout=60,
            json={"request_id": fits.json()["request_id"]},
        )
        if "try_again" not in done.text:
            break
    assert done.headers["content-type"].startswith("application/x-protobuf"), done.text
    # restarted, the service replays what it had accepted: nothing of the refused requests
    service["process"].kill()
    service["process"].wait()
    started = time.monotonic()
    service["process"] = start_serve_training(*service["args"], port=PORT, env=service_env)
    assert recorded(ledger, model_id) == 2 and time.monotonic() - started < 120


def test_sample_requests_and_models_per_key_are_bounded(service, key, model_id, tinker_clients):
    from tinker import types

    client = tinker_clients(URL, key)
    sampler = client.create_sampling_client(base_model="tiny")
    prompt = types.ModelInput.from_ints([5, 6, 7])
    with pytest.raises(Exception, match="max_sample_sequences"):
        sampler.sample(prompt, num_samples=5, sampling_params=types.SamplingParams(max_tokens=4)).result()
    with pytest.raises(Exception, match="max_sample_tokens"):
        sampler.sample(prompt, num_samples=2, sampling_params=types.SamplingParams(max_tokens=200)).result()
    assert len(sampler.sample(prompt, num_samples=2, sampling_params=types.SamplingParams(max_tokens=4)).result().sequences) == 2
    client.create_lora_training_client(base_model="tiny", rank=2).result()  # the key's second model
    with pytest.raises(Exception, match="max_models_per_key is 2"):
        client.create_lora_training_client(base_model="tiny", rank=2).result()


def test_an_unknown_limit_is_refused_at_start():
    result = run_cli("serve-training", "--model", "x=/nowhere", "--limit", "max_gpus=3")
    assert result.returncode == 2 and "NAME one of" in result.stderr


def test_nul_characters_and_unstorable_values_are_400s_not_500s(service, key, model_id):
    nul_json = httpx.post(
        f"{URL}/api/v1/create_session",
        headers={"X-API-Key": key},
        json={"tags": [], "user_metadata": {"note": "a\u0000b"}, "sdk_version": "x"},
    )
    assert nul_json.status_code == 400 and "NUL" in nul_json.text
    nul_path = httpx.get(f"{URL}/api/v1/samplers/session-x%00:sample:0", headers={"X-API-Key": key})
    assert nul_path.status_code in (400, 404) and "Traceback" not in nul_path.text
    huge_seq = httpx.post(
        f"{URL}/api/v1/optim_step",
        headers={"X-API-Key": key},
        json={"model_id": model_id, "seq_id": 2**40, "adam_params": {"learning_rate": 1e-4}},
    )
    assert huge_seq.status_code == 400, huge_seq.text


def test_sample_requests_are_taken_in_turns_of_their_keys():
    """One key's queue of sample requests does not hold another key's back."""
    from streamrl.training_service.executor import interleaved_by_key

    rows = [
        {"request_id": f"sample-key-{key}-{i:032x}"}
        for key, i in (("aa11", 1), ("aa11", 2), ("aa11", 3), ("bb22", 4), ("aa11", 5), ("cc33", 6))
    ]
    order = [r["request_id"].split("-")[2] + r["request_id"][-1] for r in interleaved_by_key(rows)]
    assert order == ["aa111", "bb224", "cc336", "aa112", "aa113", "aa115"]
