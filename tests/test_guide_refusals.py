"""The guide's settings StreamRL cannot honour are refused with the guide's meaning named,
never accepted and ignored: `save_freq: 0` ("no checkpoints") and `tool_call_mode: xml`
(NexAU's XML call syntax)."""

from __future__ import annotations

import pytest

from streamrl.producers.agent_worker import guide_key_problems
from streamrl.runtime.recipe import RecipeError, load_recipe
from tests.conftest import REPO


def test_save_freq_zero_is_refused_with_the_guides_meaning(tmp_path):
    (tmp_path / "r.yaml").write_text("trainer: {save_freq: 0}\n")
    with pytest.raises(RecipeError) as refused:
        load_recipe(tmp_path / "r.yaml")
    assert 'trainer.save_freq: 0 (the guide\'s "no checkpoints") is not supported' in str(refused.value)
    with pytest.raises(RecipeError, match="no checkpoints"):
        load_recipe(REPO / "recipes" / "arith" / "recipe.yaml", ["trainer.save_freq=0"])


def test_xml_tool_calls_are_refused_not_parsed_as_json():
    assert guide_key_problems({"tool_call_mode": "openai"}) == []
    (problem,) = guide_key_problems({"tool_call_mode": "xml"})
    assert problem.startswith("tool_call_mode: only openai") and "NexAU's XML call syntax is not parsed" in problem


@pytest.mark.parametrize(
    "trainer_type, cls, said",
    [
        ("remote_api_grpo", "Local", "Local trains here (a self-hosted Trainer), and trainer.type remote_api_grpo trains"),
        ("custom", "Remote", "Remote is a RemoteApiTrainer, which trains through service.train_service: set trainer.type"),
    ],
)
def test_a_trainer_class_of_the_other_kind_than_trainer_type_is_refused_at_validate(tmp_path, trainer_type, cls, said):
    """A self-hosted subclass under a remote type trained locally and ignored the service;
    a remote subclass under a local type crashed the learner."""
    from streamrl.learner.remote_trainers import trainer_class
    from streamrl.runtime.config import Recipe
    from streamrl.runtime.plugins import LoadError

    (tmp_path / "t.py").write_text(
        "from streamrl.api import RemoteApiTrainer, SelfHostedTrainer\n"
        "class Local(SelfHostedTrainer):\n    pass\n"
        "class Remote(RemoteApiTrainer):\n    pass\n"
    )
    recipe = Recipe.from_dict({"trainer": {"type": trainer_type, "custom_trainer_module_path": f"{tmp_path / 't.py'}:{cls}"}})
    with pytest.raises(LoadError, match=None) as refused:
        trainer_class(recipe)
    assert said in str(refused.value)


def test_an_agent_config_given_to_a_worker_that_is_not_an_agent_is_refused(tmp_path):
    from streamrl.checks import recipe_code_problems
    from streamrl.runtime.config import Recipe

    (tmp_path / "w.py").write_text(
        "from streamrl.api import BaseRolloutWorker\nclass Plain(BaseRolloutWorker):\n    def rollout(self, task):\n        return 'fail'\n"
    )
    (tmp_path / "agent.yaml").write_text("system_prompt: hi\n")
    worker = {
        "custom_rollout_worker_module_path": f"{tmp_path / 'w.py'}:Plain",
        "agent_config_path": str(tmp_path / "agent.yaml"),
    }
    problems = recipe_code_problems(Recipe.from_dict({"rollout_worker": worker}))
    assert any(
        p.startswith("rollout_worker.agent_config_path: read by agent workers only") and "Plain is not one" in p for p in problems
    ), problems


def test_the_guides_dash_c_form_takes_overrides_after_the_file():
    from tests.conftest import run_cli

    result = run_cli("run", "-c", str(REPO / "recipes" / "arith" / "recipe.yaml"), "trainer.total_train_steps=3", timeout=300)
    said = " ".join(result.stdout.split())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "3 steps" in said and "Add -r to start it" in said


def test_fine_tuning_someone_elses_model_fast_warns_once_naming_the_key(tmp_path):
    import shutil

    from streamrl.data_checks import recipe_warnings
    from streamrl.runtime.recipe import prepare_recipe

    recipe = prepare_recipe(REPO / "recipes" / "arith" / "recipe.yaml")  # lr 1e-3, the built-in model (paths resolved)
    assert recipe_warnings(recipe) == []  # a model StreamRL made: a tiny random one
    pretrained = tmp_path / "pretrained"
    shutil.copytree(recipe.rollout_worker.model_path, pretrained)
    (pretrained / "streamrl_builtin.json").unlink()
    recipe.rollout_worker.model_path = str(pretrained)
    (warning,) = recipe_warnings(recipe)
    assert warning.startswith("trainer.lr: 0.001 fine-tunes") and "near 1e-6" in warning
    recipe.trainer.lr = 1e-6
    assert recipe_warnings(recipe) == []


def test_an_agent_prompt_over_the_context_is_a_failed_rollout_not_an_empty_success():
    from streamrl.producers.agent_loop import AgentLimits, run_agent_loop
    from tests.test_agent_loop import ScriptedClient, registry

    with pytest.raises(ValueError, match=r"the agent's prompt is \d+ tokens, and max_total_tokens \(max_context_tokens\) is 20"):
        run_agent_loop(
            ScriptedClient([]), [{"role": "user", "content": "q" * 50}], registry(), limits=AgentLimits(max_total_tokens=20)
        )
