"""Experiment trackers: what the recipe's `logger` section names receives every train
step and validation, read back from each tracker's own files and compared with the
ledger; `streamrl export` sends the same numbers from the ledger afterwards."""

from __future__ import annotations

import pytest

from consumers.tracker import train_step_metrics, validation_metrics
from runtime.recipe import RecipeError, load_recipe
from schema.events import Evaluation, TrainStep
from tests.conftest import run_cli
from tests.helpers.tracker_files import mlflow_metrics, tensorboard_scalars, wandb_offline_history
from tests.test_rl_loop import RECIPE, small_run_env


def test_a_train_step_and_a_validation_become_these_numbers():
    step = TrainStep(run_id="r", step=7, weight_version=7, loss=0.5, kl=0.01, entropy=None, clip_fraction=0.25,
                     grad_norm=2.0, lr=1e-4, tokens=1200, samples=64, dropped_ids=["a", "b"],
                     staleness={"mean": 0.5, "max": 1.0}, seconds=0.4, metrics={"reward_mean": 0.75})
    assert train_step_metrics(step) == {
        "train/loss": 0.5, "train/clip_fraction": 0.25, "train/grad_norm": 2.0, "train/lr": 1e-4,
        "train/tokens": 1200.0, "train/samples": 64.0, "train/seconds": 0.4, "train/weight_version": 7.0,
        "train/dropped": 2.0, "train/kl": 0.01, "train/tokens_per_s": 3000.0, "train/staleness_mean": 0.5,
        "train/staleness_max": 1.0, "train/reward_mean": 0.75}  # no entropy: the step had none
    evaluations = [Evaluation(run_id="r", trajectory_id=f"t{i}", group_id=f"g{i}", reward=reward, metrics=metrics,
                              is_val=True, step=3)
                   for i, (reward, metrics) in enumerate([(1.0, {}), (0.2, {"accuracy": 0.0}), (0.0, {})])]
    # accuracy: the evaluator's accuracy metric where there is one, else the reward: (1 + 0 + 0) / 3
    assert validation_metrics(evaluations) == {"val/accuracy": pytest.approx(1 / 3),
                                               "val/reward_mean": pytest.approx(0.4), "val/count": 3.0}


def test_the_guides_logger_form_and_a_list_of_backends(tmp_path):
    guide = tmp_path / "guide.yaml"
    guide.write_text("project_name: p\nlogger:\n  backend: wandb\n  wandb:\n    project: ${project_name}\n"
                     "    tags: [my_task, grpo]\n")
    logger = load_recipe(guide).logger
    assert (logger.trackers(), logger.wandb.project, logger.wandb.tags) == (["wandb"], "p", ["my_task", "grpo"])
    both = tmp_path / "both.yaml"
    both.write_text("logger:\n  backend: wandb\n  backends: [mlflow, tensorboard, wandb]\n")
    assert load_recipe(both).logger.trackers() == ["wandb", "tensorboard", "mlflow"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("logger:\n  backends: [wandb, neptune]\n  tensorbord: {}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(bad)
    assert any(p.startswith("logger.backends[1]: expected one of wandb, tensorboard, mlflow") for p in info.value.problems)
    assert any("logger.tensorbord: unknown key (did you mean logger.tensorboard?)" in p for p in info.value.problems)


def ledger_steps(ledger, run_id: str) -> dict[str, dict[int, float]]:
    """The ledger's loss and mean reward, each as {step: value}."""
    rows = ledger.execute("select step, loss, (metrics->>'reward_mean')::float from train_steps where run_id = %s",
                          (run_id,)).fetchall()
    return {"train/loss": {step: loss for step, loss, _ in rows},
            "train/reward_mean": {step: reward for step, _, reward in rows}}


def ledger_validation(ledger, run_id: str) -> dict[int, float]:
    return {version: accuracy for version, accuracy in ledger.execute(
        "select step, avg(coalesce((metrics->>'accuracy')::float, reward)) from evaluations "
        "where run_id = %s and is_val group by step", (run_id,))}


def test_a_run_feeds_wandb_tensorboard_and_mlflow_and_export_resends_the_ledger(stack, ledger, run_id, tmp_path):
    result = run_cli("run", RECIPE, "logger.backends=[wandb,tensorboard,mlflow]", "logger.wandb.tags=[ci]",
                     "--run", run_id, "--out", str(tmp_path / "out"), env=small_run_env(), timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps, validation = ledger_steps(ledger, run_id), ledger_validation(ledger, run_id)
    assert sorted(steps["train/loss"]) == [1, 2, 3, 4, 5, 6] and sorted(validation) == [0, 3, 6]

    def check(wandb_dir, tensorboard_dir, mlflow_uri):
        rows, config = wandb_offline_history(next(wandb_dir.glob(f"wandb/*-{run_id}")))
        for key, expected in steps.items():
            assert {row["step"]: row[key] for row in rows if key in row} == pytest.approx(expected)
        by_version = {row["weight_version"]: row["val/accuracy"] for row in rows if "val/accuracy" in row}
        assert by_version == pytest.approx(validation)
        assert config["trainer"]["total_train_steps"] == 6  # the run's resolved config
        scalars = tensorboard_scalars(tensorboard_dir)
        for key, expected in steps.items():
            assert scalars[key] == pytest.approx(expected)
        assert scalars["val/accuracy"] == pytest.approx(validation)
        metrics = mlflow_metrics(mlflow_uri, run_id)
        for key, expected in steps.items():
            assert metrics[key] == pytest.approx(expected)
        assert metrics["val/accuracy"] == pytest.approx(validation)

    live = stack.home / "trackers" / run_id
    check(live, live / "tensorboard", f"sqlite:///{live / 'mlflow.db'}")
    assert "tracker stopped: 6 steps, 3 validations logged" in (tmp_path / "out" / "logs" / "tracker.log").read_text()

    exported = tmp_path / "exported"
    result = run_cli("export", run_id, "--to", "wandb", "--to", "tensorboard", "--to", "mlflow", "--out", str(exported),
                     timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"exported 6 steps and 3 validations of {run_id}" in result.stdout
    check(exported, exported / "tensorboard", f"sqlite:///{exported / 'mlflow.db'}")
    refused = run_cli("export", run_id, "--to", "neptune", timeout=60)
    assert refused.returncode != 0 and "--to neptune: expected one of wandb, tensorboard, mlflow" in refused.stderr
