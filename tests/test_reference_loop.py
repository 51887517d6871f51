"""The distributed run computes what the one-process reference loop computes
(streamrl/reference_loop.py): a sync-mode `streamrl run` of the built-in recipe, from the
committed warmed model, has the same weights after every step, byte for byte, and the
same per-step loss, gradient norm, learning rate, samples and reward, with one rollout
worker and with two (sampling does not depend on which worker drew a completion or
what it was batched with)."""

from __future__ import annotations

import pytest

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


def test_sync_run_equals_reference_loop(ledger, tmp_path, monkeypatch):
    model = warm_model_folder(tmp_path / "model")
    overrides = [f"rollout_worker.model_path={model}"]
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    recipe = prepare_recipe(RECIPE, overrides=overrides)
    expected = [
        (r.step, r.loss, r.grad_norm, r.lr, r.samples, r.reward_mean, float(r.groups_filtered), r.weights_sha256)
        for r in reference_loop.run(recipe, out=tmp_path / "reference")
    ]
    assert len(expected) == STEPS and len({row[-1] for row in expected}) == STEPS, "the weights changed every step"
    assert all(row[4] > 0 for row in expected), "every step trained on samples"

    for workers in (1, 2):
        run_id = f"reference-{workers}-{tmp_path.name[-12:]}"
        done = run_cli("run", RECIPE, *overrides, "--run", run_id, "--workers", str(workers), env=ENV, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert ledger_steps(ledger, run_id) == expected, f"{workers} worker(s): the run differs from the reference loop"
