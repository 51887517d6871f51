"""The learner across processes (FSDP2 over gloo, the code a GPU cluster runs with nccl),
packing, bf16 and non-finite steps, on the CPU."""

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from streamrl.learner.batching import TrainItem
from streamrl.learner.trainers import GRPOTrainer
from streamrl.runtime.config import Algorithm as AlgorithmConfig
from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.tiny_lm import build_tiny_model, load

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "tests" / "helpers" / "dist_learner.py"


def run_ranks(n: int, model: Path, work: Path, mode: str, **extra_env: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_DISABLE_PROGRESS_BARS="1", **extra_env)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        str(HARNESS),
        str(model),
        str(work),
        mode,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model"), seed=11)


def test_two_processes_train_and_resume_to_the_same_parameters_as_one(tiny, tmp_path):
    # lr 1e-3: Adam turns float noise in near-zero gradients into steps of up to lr, and
    # two ranks sum gradients in another order than one does
    for n in (1, 2):
        run_ranks(n, tiny, tmp_path / f"ranks{n}", "train")
        if n == 2:  # the two ranks' sharded snapshot, to resume on one process too
            shutil.copytree(tmp_path / "ranks2" / "checkpoints", tmp_path / "ranks2to1" / "checkpoints")
        run_ranks(n, tiny, tmp_path / f"ranks{n}", "resume")  # from the snapshot of step 3
    run_ranks(1, tiny, tmp_path / "ranks2to1", "resume")
    snapshot = tmp_path / "ranks2" / "checkpoints" / "step-000004"
    assert len(list((snapshot / "shards").glob("*.distcp"))) == 2  # each rank wrote its own shards
    # resharded on load: the one process holds exactly the weights the two ranks saved ...
    two_at_3, loaded = (torch.load(tmp_path / name) for name in ("ranks2/params-train.pt", "ranks2to1/params-loaded.pt"))
    assert all(torch.equal(two_at_3[name], loaded[name]) for name in two_at_3)
    # ... and its next step lands where the two ranks' does
    two, two_to_one = (torch.load(tmp_path / name) for name in ("ranks2/params-resume.pt", "ranks2to1/params-resume.pt"))
    assert all(torch.allclose(two[name], two_to_one[name], atol=1e-6, rtol=0) for name in two)
    start = load(tiny)[1].state_dict()
    for mode in ("train", "resume"):
        one = torch.load(tmp_path / "ranks1" / f"params-{mode}.pt")
        two = torch.load(tmp_path / "ranks2" / f"params-{mode}.pt")
        assert one.keys() == two.keys()
        for name in one:
            assert torch.allclose(one[name], two[name], atol=1e-5, rtol=0), (mode, name)
        assert any(not torch.equal(one[name], start[name]) for name in one)  # it did train
    # the weight versions the two ranks write hold the tensors one process writes (tied
    # embeddings once), so their files can hash equal
    names = [
        sorted(safe_open(next((tmp_path / f"ranks{n}" / "weights").glob("v*/model.safetensors")), "pt").keys()) for n in (1, 2)
    ]
    assert names[0] == names[1], set(names[0]) ^ set(names[1])
    moved = torch.load(tmp_path / "ranks2" / "params-train.pt")
    resumed = torch.load(tmp_path / "ranks2" / "params-resume.pt")
    assert any(not torch.equal(moved[k], resumed[k]) for k in moved)  # the resumed step trained too


def items(seed: int = 0, count: int = 6) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        n = int(rng.integers(5, 12))
        mask = np.array([0] * 2 + [1] * (n - 2), dtype=np.uint8)
        out.append(
            TrainItem(
                tokens=rng.integers(4, 60, n).astype(np.int32),
                mask=mask,
                behaviour_logprobs=(np.log(rng.uniform(0.2, 0.9, n)) * mask).astype(np.float32),
                advantage=float(rng.normal()),
                trajectory_id=str(i),
                group_id="g",
            )
        )
    return out


def one_step_grads(model_dir, packing: bool, loss_agg_mode: str = "seq-mean-token-mean", dtype="float32"):
    tokenizer, model = load(model_dir)
    trainer = GRPOTrainer(
        model,
        tokenizer.pad_token_id,
        TrainerConfig(lr=0.0, micro_batch_tokens=20, packing="packed" if packing else "padded", dtype=dtype),
        AlgorithmConfig(loss_agg_mode=loss_agg_mode),
    )
    if dtype == "bfloat16":
        from streamrl.learner.parallel import Placement

        trainer.placement = Placement(torch.device("cpu"), autocast_dtype=torch.bfloat16)
    trainer.optimizer.step = lambda: None  # keep the weights: compare gradients
    result = trainer.step(items())
    return result, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_packed_and_padded_micro_batches_give_the_same_loss_and_gradient(tiny, loss_agg_mode):
    packed, packed_grads = one_step_grads(tiny, True, loss_agg_mode)
    padded, padded_grads = one_step_grads(tiny, False, loss_agg_mode)
    assert packed.loss == pytest.approx(padded.loss, abs=1e-6)
    for name in padded_grads:
        assert torch.allclose(packed_grads[name], padded_grads[name], atol=1e-6), name
    assert packed.metrics["padding_fraction"] == 0.0 and padded.metrics["padding_fraction"] > 0.0


def test_bf16_compute_stays_close_to_float32(tiny):
    full, _ = one_step_grads(tiny, True)
    half, _ = one_step_grads(tiny, True, dtype="bfloat16")
    # bf16 keeps 8 bits of mantissa: about 3 significant digits per product, so a loss of
    # order 1 after two layers agrees to about 1e-2
    assert math.isfinite(half.loss) and half.loss == pytest.approx(full.loss, abs=2e-2)


def test_a_non_finite_loss_skips_the_step_and_says_why(tiny):
    tokenizer, model = load(tiny)
    trainer = GRPOTrainer(model, tokenizer.pad_token_id, TrainerConfig(lr=1e-2, micro_batch_tokens=64), AlgorithmConfig())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    poisoned = items()
    poisoned[2].advantage = float("nan")
    result = trainer.step(poisoned)
    assert result.skipped is not None and "non-finite" in result.skipped
    assert result.metrics["step_skipped"] == 1.0 and result.metrics["step_skipped_non_finite_loss"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # weights untouched
    healthy = trainer.step(items())
    assert healthy.skipped is None and any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_out_of_memory_step_names_the_budget_to_lower(tiny, monkeypatch):
    tokenizer, model = load(tiny)
    trainer = GRPOTrainer(model, tokenizer.pad_token_id, TrainerConfig(lr=1e-2, micro_batch_tokens=64), AlgorithmConfig())

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.17 GiB")

    monkeypatch.setattr(trainer, "micro_batch_loss", out_of_memory)
    with pytest.raises(RuntimeError, match=r"lower trainer.micro_batch_tokens \(now 64\)"):
        trainer.step(items())


def test_a_model_from_model_init_loads_like_the_built_in_one_and_trains(tmp_path):
    """`streamrl model init`: a real architecture (Qwen2-0.5B's layers, heads and widths;
    the vocabulary shrunk to the tokenizer's to keep the test small) loads through the
    learner's own loading code and takes an optimizer step."""
    from streamrl.learner.policy import Policy
    from streamrl.runtime.config import Recipe
    from tests.conftest import run_cli

    folder = tmp_path / "qwen2-0.5b"
    result = run_cli("model", "init", "--config", "qwen2-0.5b", "--out", str(folder), "--match-tokenizer-vocab")
    assert result.returncode == 0, result.stderr
    assert "qwen2-0.5b: 358M parameters" in result.stdout  # 494M less the 151,936-row embedding
    refused = run_cli("model", "init", "--config", "qwen9-1t", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "known architectures: qwen2-0.5b" in refused.stderr
    recipe = Recipe.from_dict(
        {"rollout_worker": {"model_path": str(folder)}, "trainer": {"lr": 1e-4, "micro_batch_tokens": 64, "device": "cpu"}}
    )
    policy = Policy(recipe, GRPOTrainer, tmp_path / "checkpoints")
    assert policy.model.config.num_hidden_layers == 24 and policy.model.config.hidden_size == 896
    before = policy.model.model.layers[0].mlp.up_proj.weight.detach().clone()
    result = policy.train(1e-4, items(count=2))
    assert result.skipped is None and math.isfinite(result.loss)
    assert not torch.equal(before, policy.model.model.layers[0].mlp.up_proj.weight.detach())
