"""`streamrl serve-training` with the official `tinker` client, and the built-in recipe
trained through it (trainer.type remote_api_grpo, `streamrl run --mode training-service`),
on the real embedded broker and PostgreSQL. The service is started as a user starts it,
and killed with SIGKILL in the middle of a run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from streamrl.runtime.tiny_lm import build_tiny_model
from tests.cli_zygote import cli_popen
from tests.conftest import REPO, free_port, run_cli
from tests.test_rl_loop import assert_ledger_consistent, scalar, small_run_env

PORT = free_port()
URL = f"http://127.0.0.1:{PORT}"
RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
ARITH_MODEL = REPO / "recipes" / "arith" / "generated" / "last_digit" / "model"


def start_service(models: dict, log: Path, port: int = PORT) -> subprocess.Popen:
    """`streamrl serve-training` as a user starts it, once it answers on `port`. Its
    output is appended to `log`, a file: a pipe nobody reads blocks the service once full
    (it did, beside a second copy of the suite, 2026-12-07)."""
    args = [arg for name, folder in models.items() for arg in ("--model", f"{name}={folder}")]
    with open(log, "ab") as output:  # the child holds its own descriptor
        process = cli_popen(
            [sys.executable, "-m", "streamrl.cli", "serve-training", *args, "--port", str(port), "--device", "cpu"],
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise AssertionError(f"serve-training exited {process.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.3)
    process.kill()
    raise AssertionError("serve-training did not answer within 120 s")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tiny = build_tiny_model(tmp_path_factory.mktemp("service") / "tiny")
    subprocess.run([sys.executable, str(REPO / "recipes" / "arith" / "setup.py")], check=True, cwd=REPO, capture_output=True)
    return {"tiny": str(tiny), "arith": str(ARITH_MODEL)}


@pytest.fixture(scope="module")
def service(stack, models, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-training") / "serve-training.log"
    holder = {"process": start_service(models, log), "log": log}
    yield holder
    holder["process"].kill()
    holder["process"].wait()


@pytest.fixture(scope="module")
def api_key(service):
    result = run_cli("training-key", "create", "tests", check=True)
    key = result.stdout.split()[1]
    assert key.startswith("tml-")
    return key


def datums(tokenizer, types):
    rows = [("12+34=", "6"), ("7+8=", "5"), ("40+2=", "2")]
    data = []
    for prompt, answer in rows:
        ids = tokenizer(prompt)["input_ids"] + tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id]
        n = len(ids) - 1
        weights = np.array([0.0] * (n - 2) + [1.0, 1.0], np.float32)
        old = np.linspace(-3.0, -2.0, n).astype(np.float32)  # a sampler's logprobs, made up
        advantages = np.array([0.0] * (n - 2) + [0.5, -0.25], np.float32)
        data.append((ids, weights, old, advantages))
    wire = [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": np.array(ids[1:], np.int64), "weights": w, "logprobs": o, "advantages": a},
        )
        for ids, w, o, a in data
    ]
    return data, wire


def test_the_tinker_client_trains_samples_and_gets_streamrls_losses(stack, models, service, api_key, ledger, tinker_clients):
    from tinker import types
    from transformers import AutoModelForCausalLM

    from streamrl.algos.losses import clamped_ratio, token_logprobs

    client = tinker_clients(URL, api_key)
    trainer = client.create_lora_training_client(base_model="tiny", rank=4).result()
    tokenizer = trainer.get_tokenizer()  # the served model's own, through get_info's tokenizer_id
    data, wire = datums(tokenizer, types)

    # A fresh LoRA (B = 0) is the base model: StreamRL's own logprobs and loss maths on the
    # same datums give the service's losses (float32 on both sides: 1e-4 relative).
    base = AutoModelForCausalLM.from_pretrained(models["tiny"], dtype=torch.float32).eval()
    expected = {"cross_entropy": 0.0, "importance_sampling": 0.0}
    with torch.no_grad():
        for ids, weights, old, advantages in data:
            logits = base(input_ids=torch.tensor([ids])).logits
            logp = token_logprobs(logits, torch.tensor([ids]))[0, 1:]  # logprob of token t+1 after t
            expected["cross_entropy"] += float(-(torch.from_numpy(weights) * logp).sum())
            ratio = clamped_ratio(logp, torch.from_numpy(old))
            expected["importance_sampling"] += float(-(ratio * torch.from_numpy(advantages)).sum())
    for loss_fn, value in expected.items():
        got = trainer.forward(wire, loss_fn).result().metrics["loss:sum"]
        assert got == pytest.approx(value, rel=1e-4), loss_fn

    # training lowers the supervised loss; every step is one recorded optim_step
    before = expected["cross_entropy"]
    for _ in range(4):
        trainer.forward_backward(wire, "cross_entropy")
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = trainer.forward(wire, "cross_entropy").result().metrics["loss:sum"]
    assert after < before - 0.5, (before, after)
    steps = scalar(
        ledger,
        "select count(*) from service_requests where model_id = %s and kind = 'optim_step' and status = 'complete' and runs = 1",
        trainer.model_id,
    )
    assert steps == 4

    # sampler weights, then sampling from them: token ids with their logprobs
    path = trainer.save_weights_for_sampler(name="trained").result().path
    sampler = client.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints(tokenizer("12+34=")["input_ids"])
    result = sampler.sample(
        prompt=prompt, num_samples=3, sampling_params=types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    ).result()
    assert len(result.sequences) == 3
    for sequence in result.sequences:
        assert 1 <= len(sequence.tokens) <= 4 and len(sequence.logprobs) == len(sequence.tokens)
        assert all(lp <= 0.0 for lp in sequence.logprobs)
    # the saved state reloads into a new training client with the same weights
    state = trainer.save_state("after-4").result().path
    reloaded = client.create_training_client_from_state_with_optimizer(state).result()
    assert reloaded.forward(wire, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(after, rel=1e-5)
    client.close("success").result()


def test_requests_without_a_valid_key_or_with_a_bad_datum_are_refused_and_change_nothing(
    stack, service, api_key, ledger, tinker_clients
):
    import tinker
    from tinker import types

    for headers in ({}, {"X-API-Key": "tml-not-a-key"}):
        response = httpx.post(
            f"{URL}/api/v1/create_session", headers=headers, json={"tags": [], "user_metadata": None, "sdk_version": "x"}
        )
        assert response.status_code == 401, response.text
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=URL, api_key="tml-wrong").create_lora_training_client(base_model="tiny", rank=4)
    stored = scalar(ledger, "select key_sha256 from service_api_keys where name = 'tests'")
    assert api_key not in stored and len(stored) == 64  # only the digest

    client = tinker_clients(URL, api_key)
    trainer = client.create_lora_training_client(base_model="tiny", rank=4).result()
    ids = [5, 6, 7, 8]
    good = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": np.array(ids[1:]), "weights": np.ones(3, np.float32)},
    )
    loss = trainer.forward([good], "cross_entropy").result().metrics["loss:sum"]
    requests = scalar(ledger, "select count(*) from service_requests where model_id = %s", trainer.model_id)
    bad = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": np.array(ids[1:]), "weights": np.ones(5, np.float32)},
    )
    with pytest.raises(Exception, match=r"data\[0\]\.loss_fn_inputs\.weights: 5 values for 3 input tokens"):
        trainer.forward_backward([bad], "cross_entropy").result()
    unknown = httpx.post(
        f"{URL}/api/v1/create_model",
        headers={"X-API-Key": api_key},
        json={"session_id": "nope", "model_seq_id": 0, "base_model": "tiny"},
    )
    assert unknown.status_code == 404 and "session_id" in unknown.text
    assert scalar(ledger, "select count(*) from service_requests where model_id = %s", trainer.model_id) == requests
    # a run whose training service is down stops before it starts, with one sentence
    result = run_cli(
        "run",
        RECIPE,
        "--mode",
        "training-service",
        "trainer.type=remote_api_grpo",
        "trainer.warmup_until_accuracy=null",  # a remote warm-up runs its fixed count
        "service.train_service.backend=tinker",
        "service.train_service.url=http://127.0.0.1:9",
        f"service.tinker_service.api_key={api_key}",
    )
    said = " ".join(result.stderr.split())
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "the training service at http://127.0.0.1:9 did not answer after 3 tries" in said
    # (the official client refuses further requests once one failed:) a new training client
    # on the same base model and seed computes the same loss as before the bad request
    fresh = client.create_lora_training_client(base_model="tiny", rank=4).result()
    assert fresh.forward([good], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(loss, rel=1e-6)


STEPS = 16
WARMUP = 650


@pytest.mark.timeout(1500)  # a hang guard: up to 299 s alone, over 400 s to step 6 beside a second suite (docs/benchmarks.md)
def test_the_built_in_recipe_learns_through_the_service_killed_mid_run(stack, service, models, api_key, ledger, run_id, tmp_path):
    """remote_api_grpo against serve-training, full fine-tuning (lora_rank 0): the recipe's
    cross-entropy warm-up and its GRPO steps run on the service, which is SIGKILLed after
    step 6 and started again; after step 10 the remote trainer is SIGKILLed too. The run
    finishes, no optimizer step is applied twice, the ledger is exact, and held-out
    accuracy rises from the untrained model's (measured by the service's own sampler) to
    the final validation's."""
    overrides = [
        "trainer.type=remote_api_grpo",
        "trainer.warmup_until_accuracy=null",  # its fixed count
        # the learning rate this test's margin was measured at (2026-11-25, 0.9 and more
        # after): the recipe's 1e-3 follows a warm-up that ends at 0.5 held-out, not this
        # fixed count, and this run ended at 0.36 and 0.71 with it (2026-11-26)
        "trainer.lr=3.0e-4",
        "service.train_service.backend=tinker",
        f"service.train_service.url={URL}",
        "service.train_service.base_model=arith",
        "service.tinker_service.lora_rank=0",
        f"service.tinker_service.api_key={api_key}",
        # a snapshot of the service's state every step: the killed trainer resumes from
        # it (re-training recorded steps after a snapshot: tests/test_rl_loop.py)
        "trainer.save_freq=1",
    ]
    env = {**os.environ, **small_run_env(ARITH_STEPS=str(STEPS), ARITH_WARMUP_STEPS=str(WARMUP), ARITH_VALIDATE_EVERY=str(STEPS))}
    run = cli_popen(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "run",
            RECIPE,
            *overrides,
            "--mode",
            "training-service",
            "--run",
            run_id,
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # on the run's progress, not a fixed time (its start took over 400 s with a second
        # copy of the suite beside it): the test's own timeout is the hang guard
        while scalar(ledger, "select count(*) from train_steps where run_id = %s", run_id) < 6:
            assert run.poll() is None, run.stdout.read()[-3000:]
            time.sleep(0.5)
        service["process"].send_signal(signal.SIGKILL)
        service["process"].wait()
        service["process"] = start_service(models, service["log"])  # down until it answers again
        # then the remote trainer: `streamrl run` restarts it, and it resumes from its last
        # checkpoint's service state
        while scalar(ledger, "select count(*) from train_steps where run_id = %s", run_id) < 10:
            assert run.poll() is None, run.stdout.read()[-3000:]
            time.sleep(0.5)
        trainer = subprocess.run(["pgrep", "-f", f"streamrl.cli learner {run_id}"], capture_output=True, text=True)
        os.kill(int(trainer.stdout.split()[0]), signal.SIGKILL)
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, output[-3000:]
    # the loop runs as the remote trainer, a process that holds no model
    assert (tmp_path / "logs" / "remote-trainer.log").exists() and not (tmp_path / "logs" / "learner.log").exists()

    assert [r[0] for r in ledger.execute("select step from train_steps where run_id = %s order by step", (run_id,))] == list(
        range(1, STEPS + 1)
    )
    assert_ledger_consistent(ledger, run_id, STEPS, 1)
    # one model (full fine-tuning), 60 warm-up + STEPS optimizer steps, each applied once
    started = scalar(ledger, "select details from run_events where run_id = %s and kind = 'started' and name = 'learner'", run_id)
    model_id = started["service_model"]
    assert (
        scalar(
            ledger,
            "select user_metadata->>'streamrl_run' from service_sessions s join service_models m "
            "using (session_id) where m.model_id = %s",
            model_id,
        )
        == run_id
    )
    # full fine-tuning; the warm-up trains one model, RL a second one loaded from its weights
    # (a fresh optimizer), the resumed trainer a third one from its last checkpoint's state.
    # The service's kill applied no step twice: every optim_step ran once, in sequence.
    optim = ledger.execute(
        """
        select count(*), count(distinct (r.model_id, r.seq_id)), max(r.runs), count(distinct r.model_id)
        from service_requests r join service_models m using (model_id) join service_sessions s using (session_id)
        where s.user_metadata->>'streamrl_run' = %s and r.kind = 'optim_step' and r.status = 'complete'""",
        (run_id,),
    ).fetchone()
    resumed = ledger.execute("select sequence, details from run_events where run_id = %s and kind = 'resumed'", (run_id,))
    [(resume_number, details)] = resumed.fetchall()  # the trainer was killed once
    resumed_after = details["after_step"]
    assert resume_number == 1
    assert 10 <= resumed_after < STEPS and optim[2] == 1 and optim[3] == 3
    # the killed trainer may have had one step applied that its checkpoint did not record:
    # the resumed one trains that step again from the checkpoint's state, not on top of it
    assert optim[0] == optim[1] and WARMUP + STEPS <= optim[0] <= WARMUP + STEPS + 1
    assert (
        scalar(ledger, "select count(*) from service_requests where model_id = %s and kind = 'optim_step'", model_id)
        >= resumed_after
    )
    # held-out accuracy: the untrained model's (greedy, by the service's sampler) vs the
    # rollout workers' final validation (observed: 0.0 before, 0.9 and more after)
    before = started["val_accuracy_before_warmup"]
    after = scalar(ledger, "select avg(reward) from evaluations where run_id = %s and is_val and step = %s", run_id, STEPS)
    print(f"held-out accuracy {before:.3f} -> {after:.3f}")
    assert after >= before + 0.5, f"held-out accuracy {before:.3f} -> {after:.3f}"


def test_a_checkpoint_name_is_a_name_never_a_path(stack, service, api_key, ledger, tmp_path, tinker_clients):
    """save_weights / save_weights_for_sampler with `../` or an absolute path are refused
    (400, naming the field) before they are recorded; the folder they aimed at is untouched."""
    from tinker import types

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    trainer = tinker_clients(URL, api_key).create_lora_training_client(base_model="tiny", rank=4).result()
    before = scalar(ledger, "select count(*) from service_requests where model_id = %s", trainer.model_id)
    attacks = [str(victim), "../../../../../../../../" + str(victim).lstrip("/"), "..", "a/b", ".hidden", "x" * 200]
    for request_type in (types.SaveWeightsRequest, types.SaveWeightsForSamplerRequest):
        for name in attacks:
            body = request_type(model_id=trainer.model_id, path=name, seq_id=before + 1).model_dump_json()
            kind = "save_weights" if request_type is types.SaveWeightsRequest else "save_weights_for_sampler"
            response = httpx.post(
                f"{URL}/api/v1/{kind}", headers={"X-API-Key": api_key, "Content-Type": "application/json"}, content=body
            )
            assert response.status_code == 400, (name, response.text)
            assert f"{request_type.__name__}.path" in response.json()["detail"]
    assert (victim / "keep.txt").read_text() == "mine" and sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert scalar(ledger, "select count(*) from service_requests where model_id = %s", trainer.model_id) == before
    # a name is fine, and lands under the model's own folder
    saved = trainer.save_state("step-1.ok").result()
    assert saved.path == f"tinker://{trainer.model_id}/weights/step-1.ok"


def test_another_keys_models_sessions_weights_and_futures_are_not_found(stack, service, api_key, ledger, tinker_clients):
    """Key B, on every route that names something of key A's: the same 404 (or 400 for a
    sampler path) as for something that does not exist, and nothing of A's changes."""
    from tinker import types

    other = run_cli("training-key", "create", "other-tenant", check=True).stdout.split()[1]
    owner = tinker_clients(URL, api_key)
    trainer = owner.create_lora_training_client(base_model="tiny", rank=4).result()
    sampler_path = trainer.save_weights_for_sampler("for-a").result().path
    sampling = owner.create_sampling_client(model_path=sampler_path)
    future = sampling.sample(types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=2, temperature=1.0))
    future.result()
    sample_request = scalar(
        ledger, "select request_id from service_requests where kind = 'sample' order by created_at desc limit 1"
    )
    session_of_a = trainer.model_id.split(":")[0]
    headers = {"X-API-Key": other}

    def post(route, body):
        return httpx.post(f"{URL}/api/v1/{route}", headers=headers, json=body)

    missing = post("get_info", {"model_id": "session-nope:train:0"})
    for response in (
        post("get_info", {"model_id": trainer.model_id}),
        missing,
        post("retrieve_future", {"request_id": sample_request}),
        post("retrieve_future", {"request_id": f"{trainer.model_id}:0"}),
        httpx.get(f"{URL}/api/v1/samplers/{session_of_a}:sample:0", headers=headers),
    ):
        assert response.status_code == 404, response.text
    assert "for this API key" in post("get_info", {"model_id": trainer.model_id}).text
    session_of_b = post("create_session", {"tags": [], "user_metadata": None, "sdk_version": "x"}).json()["session_id"]
    stolen = post(
        "create_sampling_session", {"session_id": session_of_b, "sampling_session_seq_id": 0, "model_path": sampler_path}
    )
    assert stolen.status_code == 400 and "model_path" in stolen.text
    sample = post(
        "asample",
        {
            "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5]}]},
            "sampling_params": {"max_tokens": 1},
            "model_path": sampler_path,
        },
    )
    assert sample.status_code == 400 and "model_path" in sample.text
