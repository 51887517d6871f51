"""weight.transport distributed against a real SGLang server (its CPU engine, gloo): the
learner's broadcaster sends a version no folder holds, the server serves it with the
learner's logprobs and reports its number; a broadcast that cannot form (a rank that
never joins) frees the server and the version arrives from its folder instead."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.algos.losses import token_logprobs_and_entropy
from streamrl.learner.checkpoint import write_weight_version
from streamrl.learner.weight_broadcast import WeightBroadcaster
from streamrl.producers.inference import SamplingParams
from streamrl.producers.sglang_engine import Server, SGLangEngine
from tests.conftest import REPO, run_cli
from tests.helpers.warm_model import warm_model_folder
from tests.test_rl_loop import assert_ledger_consistent

PROMPT = "12+34="


@pytest.fixture
def engine(server, model_dir):
    engine = SGLangEngine([Server(server.url)], AutoTokenizer.from_pretrained(model_dir), sync_timeout_s=60)
    yield engine
    engine.close()


def perturbed(model_dir: Path, seed: int):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model


def scored(model, prompt: list[int], response: list[int]) -> list[float]:
    tokens = torch.tensor([prompt + response])
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(model(input_ids=tokens).logits, tokens, 1.0)
    return logprobs[0, len(prompt) :].tolist()


def test_a_broadcast_version_is_served_without_a_folder(engine, model_dir, tmp_path):
    model = perturbed(model_dir, seed=11)
    state = model.state_dict()
    broadcaster = WeightBroadcaster("127.0.0.1", 2, torch.device("cpu"), timeout_s=60)
    manifest = broadcaster.open(5, state)
    assert manifest.world_size == 2 and manifest.names == list(state) and manifest.backend == "gloo"
    sent = []
    sender = threading.Thread(target=lambda: sent.append(broadcaster.send(manifest, state)))
    sender.start()
    never_written = tmp_path / "v000005"
    engine.update_weights(str(never_written), 5, broadcast=manifest)
    sender.join(60)
    assert sent == [True] and engine.broadcast_fallbacks == 0 and not never_written.exists()
    prompt = engine.tokenizer(PROMPT)["input_ids"]
    completion = engine.complete(prompt, SamplingParams(max_new_tokens=8, temperature=1.0))
    assert completion.weight_version == 5
    assert completion.logprobs == pytest.approx(scored(model, prompt, completion.response_token_ids), abs=1e-4)


def test_a_broadcast_that_cannot_form_falls_back_to_the_folder(engine, model_dir, tmp_path):
    """World size 3 with one server: rank 2 never joins. The learner's side gives up after
    its timeout and closes the rendezvous, which frees the server; the worker loads the
    folder the learner writes next, and the server serves that version."""
    model = perturbed(model_dir, seed=12)
    state = model.state_dict()
    broadcaster = WeightBroadcaster("127.0.0.1", 3, torch.device("cpu"), timeout_s=8)
    manifest = broadcaster.open(6, state)
    sent = []
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def learner_side():
        sent.append(broadcaster.send(manifest, state))
        write_weight_version(tmp_path, 6, model, tokenizer, state)

    sender = threading.Thread(target=learner_side)
    sender.start()
    engine.update_weights(str(tmp_path / "v000006"), 6, broadcast=manifest)
    sender.join(60)
    assert sent == [False] and engine.broadcast_fallbacks == 1
    prompt = engine.tokenizer(PROMPT)["input_ids"]
    completion = engine.complete(prompt, SamplingParams(max_new_tokens=8, temperature=1.0))
    assert completion.weight_version == 6
    assert completion.logprobs == pytest.approx(scored(model, prompt, completion.response_token_ids), abs=1e-4)


def test_the_sglang_recipe_trains_on_broadcast_versions(stack, ledger, run_id, tmp_path, sglang_python):
    """`streamrl run` with weight.transport distributed: every version after 0 (which is
    loaded from its folder before any broadcast) reaches the server by broadcast, none
    falls back to its folder, and the ledger is exact."""
    # sync mode: the worker receives each version from its weights thread, not between
    # batches; a version every 2 steps
    sync_every = 2
    model = warm_model_folder(tmp_path / "model")  # answers in the format: groups to train
    env = {"ARITH_STEPS": "4", "ARITH_WARMUP_STEPS": "0", "ARITH_VALIDATE_EVERY": "4", "ARITH_SYNC_MODE": "sync"}
    result = run_cli(
        "run",
        str(REPO / "recipes" / "arith" / "sglang.yaml"),
        f"rollout_worker.model_path={model}",
        "--run",
        run_id,
        "--out",
        str(tmp_path / "out"),
        "weight.transport=distributed",
        f"weight.sync_every={sync_every}",
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # staleness counts versions: sync's 0 versions behind is up to 1 step with a version every 2
    assert_ledger_consistent(ledger, run_id, steps=4, staleness_threshold=1)
    versions = [r[0] for r in ledger.execute("select version from weight_versions where run_id = %s order by version", (run_id,))]
    assert versions == list(range(0, 5, sync_every))
    server_log = "".join(p.read_text() for p in stack.home.glob(f"runs/{run_id}/logs/sglang-*.log"))
    assert server_log.count("POST /update_weights_from_distributed") == len(versions) - 1
    assert server_log.count("POST /update_weights_from_disk") == 1  # version 0
    assert "did not arrive by broadcast" not in (tmp_path / "out" / "logs" / "worker-0.log").read_text()
