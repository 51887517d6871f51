"""The distributed run computes what the one-process reference loop computes
(streamrl/reference_loop.py): a sync-mode `streamrl run` of the built-in recipe, from the
committed warmed model, has the same weights after every step and the same per-step
loss, gradient norm, learning rate, samples, filtered groups and reward, with two
rollout workers: sampling does not depend on which worker drew a completion or what it
was batched with.

Byte for byte where the PPO ratio's denominator is the learner's own logprobs
(`algorithm.do_old_log_prob_compute`). With the sampler's logprobs as the denominator
(the recipe's default) the weights agree to 1e-6: the CPU's matrix kernels depend on
the batch's shape, so a completion's logprobs differ in their last bits between a batch
of 256 (the reference loop) and whatever a worker batched it with (docs/anatomy.md)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from streamrl import reference_loop
from streamrl.runtime.recipe import prepare_recipe
from tests.conftest import REPO, run_cli
from tests.helpers.warm_model import warm_model_folder

RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
STEPS = 4
ENV = {"ARITH_STEPS": str(STEPS), "ARITH_WARMUP_STEPS": "0", "ARITH_SYNC_MODE": "sync", "ARITH_VALIDATE_EVERY": "100"}

pytestmark = pytest.mark.slow


def ledger_steps(conn, run_id: str) -> list[tuple]:
    return conn.execute(
        """select t.step, t.loss, t.grad_norm, t.lr, t.samples, (t.metrics->>'reward_mean')::float,
                  (t.metrics->>'groups_filtered')::float, w.sha256
           from train_steps t join weight_versions w on w.run_id = t.run_id and w.version = t.step
           where t.run_id = %s order by t.step""",
        (run_id,),
    ).fetchall()


def reference(recipe_overrides: list[str], out) -> list[tuple]:
    recipe = prepare_recipe(RECIPE, overrides=recipe_overrides)
    return [
        (r.step, r.loss, r.grad_norm, r.lr, r.samples, r.reward_mean, float(r.groups_filtered), r.weights_sha256)
        for r in reference_loop.run(recipe, out=out)
    ]


def run(overrides: list[str], run_id: str, workers: int) -> None:
    done = run_cli("run", RECIPE, *overrides, "--run", run_id, "--workers", str(workers), env=ENV, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_sync_run_equals_reference_loop(stack, ledger, tmp_path, monkeypatch):
    model = warm_model_folder(tmp_path / "model")
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    exact = [f"rollout_worker.model_path={model}", "algorithm.do_old_log_prob_compute=true"]
    expected = reference(exact, tmp_path / "reference")
    assert len(expected) == STEPS and len({row[-1] for row in expected}) == STEPS, "the weights changed every step"
    assert all(row[4] > 0 for row in expected), "every step trained on samples"
    run_id = f"reference-exact-{tmp_path.name[-12:]}"
    run(exact, run_id, 2)
    assert ledger_steps(ledger, run_id) == expected, "the run differs from the reference loop"

    default = [f"rollout_worker.model_path={model}"]
    expected = reference(default, tmp_path / "reference-default")
    run_id = f"reference-default-{tmp_path.name[-12:]}"
    run(default, run_id, 2)
    got = ledger_steps(ledger, run_id)
    assert [row[4:7] for row in got] == [row[4:7] for row in expected], "the same samples, rewards and filtered groups"
    for row, want in zip(got, expected):
        assert row[1:4] == pytest.approx(want[1:4], rel=1e-5, abs=1e-7)
    for step in range(1, STEPS + 1):
        weights = load_file(stack.home / "weights" / run_id / f"v{step:06d}" / "model.safetensors")
        wanted = load_file(tmp_path / "reference-default" / f"v{step:06d}" / "model.safetensors")
        for name, tensor in wanted.items():
            torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=f"step {step}: {name}")
