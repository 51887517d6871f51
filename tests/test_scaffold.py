"""`streamrl recipe new`: the scaffold is a valid recipe whose code loads, whose env
script and set-up script run, and whose agent worker rolls a task out."""

from __future__ import annotations

import os

from streamrl.checks import recipe_code_problems
from streamrl.producers.evaluator import Evaluator
from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams
from streamrl.producers.rollout import InferenceClient
from streamrl.producers.worker_loop import make_evaluator, worker_class
from streamrl.runtime.recipe import prepare_recipe
from streamrl.schema.events import Task, unpack_mask
from tests.conftest import run_cli


def test_recipe_new_scaffolds_a_recipe_that_runs_a_rollout(tmp_path, monkeypatch):
    result = run_cli("recipe", "new", "word_game", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "word_game"
    for name in (
        "common.yaml",
        "word_game.yaml",
        "word_game.env.sh",
        "setup.py",
        "agent_workspace/agent_config.yaml",
        "agent_workspace/tools.yaml",
        "agent_workspace/evaluator.py",
        "agent_workspace/my_worker.py",
    ):
        assert (folder / name).is_file(), name
    again = run_cli("recipe", "new", "word_game", "--dir", str(tmp_path))
    assert again.returncode == 2 and "already exists" in again.stderr

    monkeypatch.setenv("WORD_GAME_STEPS", "7")  # the caller's value beats the env script's default
    monkeypatch.delenv("WORD_GAME_WARMUP_STEPS", raising=False)
    recipe = prepare_recipe(folder / "word_game.yaml")
    assert recipe.trainer.total_train_steps == 7 and recipe.trainer.warmup_cross_entropy_steps == 100
    assert os.environ["WORD_GAME_WARMUP_STEPS"] == "100"  # set by word_game.env.sh
    assert recipe_code_problems(recipe) == []
    assert isinstance(make_evaluator(recipe), Evaluator)

    engine = BatchingEngine(EmbeddedEngine(recipe.rollout_worker.model_path))
    try:
        published = []
        client = InferenceClient(engine, SamplingParams(max_new_tokens=48))
        worker = worker_class(recipe)(recipe.rollout_worker.worker_config(), client, make_evaluator(recipe), published.append)
        task = Task(
            run_id="scaffold", task_id="t", group_id="g", prompt="reverse abcd", data={"prompt": "reverse abcd", "answer": "dcba"}
        )
        trajectory, evaluation = worker.run_task(task)
    finally:
        engine.close()
    assert trajectory.error is None and evaluation.error is None
    assert trajectory.turns[0].role == "prompt" and unpack_mask(trajectory.loss_mask).sum() > 0


def test_recipe_new_refuses_a_bad_name(tmp_path):
    result = run_cli("recipe", "new", "9lives", "--dir", str(tmp_path))
    assert result.returncode == 2 and "use letters, digits and underscores" in result.stderr


def test_recipe_new_single_turn_validates_as_generated_and_rolls_out_a_chat_prompt(tmp_path):
    result = run_cli("recipe", "new", "reverser", "--dir", str(tmp_path), "--template", "single-turn")
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "reverser"
    assert {p.name for p in folder.iterdir()} >= {"common.yaml", "reverser.yaml", "reverser.env.sh", "setup.py", "evaluator.py"}
    validated = run_cli("recipe", "validate", str(folder / "reverser.yaml"))
    assert validated.returncode == 0 and "valid" in validated.stdout, validated.stdout + validated.stderr
    recipe = prepare_recipe(folder / "reverser.yaml")
    engine = BatchingEngine(EmbeddedEngine(recipe.rollout_worker.model_path))
    try:
        client = InferenceClient(engine, SamplingParams(max_new_tokens=8))
        worker = worker_class(recipe)(recipe.rollout_worker.worker_config(), client, make_evaluator(recipe), lambda event: None)
        messages = [{"role": "system", "content": "Reverse the word."}, {"role": "user", "content": "abcd"}]
        trajectory, evaluation = worker.run_task(
            Task(run_id="scaffold", task_id="t", group_id="g", prompt=messages, data={"prompt": messages, "answer": "dcba"})
        )
        sent = client.recorded()[0].prompt_token_ids
    finally:
        engine.close()
    assert trajectory.error is None and evaluation.error is None
    assert engine.tokenizer.decode(sent) == (
        "<|im_start|>system\nReverse the word.<|im_end|>\n<|im_start|>user\nabcd<|im_end|>\n<|im_start|>assistant\n"
    )
    bad = run_cli("recipe", "new", "x", "--dir", str(tmp_path), "--template", "chat")
    assert bad.returncode == 2 and "one of agent, single-turn" in bad.stderr
