"""trainer.lora.versions adapter against a real SGLang server (its CPU engine, LoRA
backend torch_native): a version is the adapter alone, loaded with /load_lora_adapter,
reported as the server's weight version, and sampled with the learner's logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.producers.inference import SamplingParams
from streamrl.producers.sglang_adapters import lora_server_args
from streamrl.producers.sglang_engine import Server, SGLangEngine
from streamrl.producers.sglang_server import ManagedServer
from streamrl.runtime.config import Lora
from streamrl.runtime.lora import LoraSpec, with_lora, write_adapter_folder
from tests.conftest import REPO, run_cli
from tests.test_rl_loop import assert_ledger_consistent
from tests.test_weight_broadcast import scored

PROMPT = "12+34="
LORA = Lora(rank=8, alpha=16.0, versions="adapter")


@pytest.fixture(scope="module")
def engine(sglang_python, model_dir, tmp_path_factory):
    managed = ManagedServer(
        sglang_python, str(model_dir), "cpu", lora_server_args(LORA, "cpu"), tmp_path_factory.mktemp("sglang") / "server.log"
    )
    managed.start()
    engine = SGLangEngine(
        [Server(managed.url, managed=managed)], AutoTokenizer.from_pretrained(model_dir), sync_timeout_s=120, adapters=True
    )
    yield engine
    engine.close()


def trained_adapter(model_dir: Path, seed: int):
    """A LoRA model whose adapter is not the zero one a fresh adapter is."""
    torch.manual_seed(seed)
    model = with_lora(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        LoraSpec(LORA.rank, LORA.alpha, 0.0, tuple(LORA.target_modules)),
    ).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.2)
    return model


def test_adapter_versions_load_switch_and_resync(engine, model_dir, tmp_path):
    prompt = engine.tokenizer(PROMPT)["input_ids"]
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    for version, seed in ((3, 1), (4, 2)):
        model = trained_adapter(model_dir, seed)
        folder = write_adapter_folder(tmp_path / f"v{version:06d}", model, model.state_dict())
        assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        engine.update_weights(str(folder), version)
        completion = engine.complete(prompt, params)
        assert completion.weight_version == version
        assert completion.logprobs == pytest.approx(scored(model, prompt, completion.response_token_ids), abs=1e-4)
    # the same version again (what a re-sync does) reloads it rather than failing on its name
    engine.update_weights(str(folder), 4)
    again = engine.complete(prompt, params)
    assert again.weight_version == 4
    assert again.logprobs == pytest.approx(scored(model, prompt, again.response_token_ids), abs=1e-4)


def test_the_sglang_recipe_trains_a_lora_adapter_served_as_adapters(stack, ledger, run_id, tmp_path, sglang_python):
    """`streamrl run` with trainer.lora versions adapter: each version is an adapter folder
    (megabytes), every one after 0 reaches the server through /load_lora_adapter, and the
    tokens sampled by the weights being trained score as the learner scores them."""
    env = {"ARITH_STEPS": "3", "ARITH_WARMUP_STEPS": "150", "ARITH_VALIDATE_EVERY": "3", "ARITH_SYNC_MODE": "sync"}
    result = run_cli(
        "run",
        str(REPO / "recipes" / "arith" / "sglang.yaml"),
        "--run",
        run_id,
        "--out",
        str(tmp_path),
        "trainer.lora.rank=8",
        "trainer.lora.versions=adapter",
        # this test is about serving: groups whose rewards are equal (all of them, when
        # a short LoRA warm-up leaves the model at 0 or 1 per prompt) train all the same
        "algorithm.filter_zero_variance=false",
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_ledger_consistent(ledger, run_id, steps=3, staleness_threshold=0)
    uris = [r[0] for r in ledger.execute("select uri from weight_versions where run_id = %s order by version", (run_id,))]
    assert len(uris) == 4
    server_log = "".join(p.read_text() for p in stack.home.glob(f"runs/{run_id}/logs/sglang-*.log"))
    assert server_log.count("POST /load_lora_adapter") == 4 and "POST /update_weights_from_disk" not in server_log
    # one gap per step that trained samples (a step whose groups were all filtered has none)
    trained_steps = [r[0] for r in ledger.execute("select step from train_steps where run_id = %s and samples > 0", (run_id,))]
    gaps = ledger.execute("select gap_mean_lag0 from logprob_gaps where run_id = %s", (run_id,)).fetchall()
    assert len(gaps) == len(trained_steps) >= 1 and max(lag0 for (lag0,) in gaps if lag0 is not None) < 1e-3
