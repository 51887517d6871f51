"""Recipe loading and `streamrl recipe validate`."""

import re
import textwrap

import pytest

from streamrl.runtime.recipe import RecipeError, load_recipe
from tests.conftest import REPO, run_cli


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def recipe_tree(tmp_path):
    write(
        tmp_path / "recipes" / "common" / "base.yaml",
        """
        trainer:
          lr: 1.0e-4
          total_train_steps: 50
        algorithm:
          type: rloo
        weight:
          sync_mode: fully-async
          staleness_threshold: 3
    """,
    )
    write(tmp_path / "recipes" / "task" / "train.jsonl", '{"prompt": "1+1=", "answer": "2"}\n')
    return tmp_path / "recipes" / "task"


def test_defaults_compose_and_self_wins(recipe_tree, monkeypatch):
    monkeypatch.setenv("TEST_STEPS", "7")
    recipe = write(
        recipe_tree / "recipe.yaml",
        """
        defaults:
          - common/base
          - _self_
        experiment_name: arith-${oc.env:TEST_USER,anonymous}
        data:
          data_files: [train.jsonl]
        trainer:
          total_train_steps: ${oc.env:TEST_STEPS,100}
        algorithm:
          type: dr_grpo
    """,
    )
    values = load_recipe(recipe)
    assert values.experiment_name == "arith-anonymous"  # env default
    assert values.trainer.total_train_steps == 7  # env string -> the key's int
    assert values.trainer.lr == 1.0e-4  # from common/base
    assert values.algorithm.type == "dr_grpo"  # _self_ last: the recipe wins
    assert values.weight.staleness_threshold == 3
    assert values.weight.sync_mode == "fully-async"  # from common/base
    assert values.rollout_worker.temperature == 1.0  # schema default
    assert values.trainer.checkpoint_path == "runs/arith-anonymous/checkpoints"


def test_self_first_lets_the_defaults_win(recipe_tree):
    recipe = write(
        recipe_tree / "r.yaml",
        """
        defaults: [_self_, common/base]
        algorithm: {type: grpo}
    """,
    )
    assert load_recipe(recipe).algorithm.type == "rloo"


def test_every_problem_is_reported_with_its_key_path(recipe_tree):
    recipe = write(
        recipe_tree / "bad.yaml",
        """
        trainer:
          total_train_step: 10
          lr: fast
        algoritm: {}
        weight:
          staleness_threshold: [1]
        data:
          data_files: [train.jsonl]
          shuffle: "maybe"
    """,
    )
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe)
    problems = "\n".join(info.value.problems)
    assert "trainer.total_train_step: unknown key (did you mean trainer.total_train_steps?)" in problems
    assert "trainer.lr: expected float, got str 'fast'" in problems
    assert "algoritm: unknown key (did you mean algorithm?)" in problems
    assert "weight.staleness_threshold: expected int, got list" in problems
    assert "data.shuffle: expected bool, got str 'maybe'" in problems


def test_missing_files_and_defaults(recipe_tree):
    recipe = write(
        recipe_tree / "files.yaml",
        """
        data: {data_files: [train.jsonl, nowhere.parquet]}
        rollout_worker: {custom_rollout_worker_module_path: worker.py}
    """,
    )
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe)
    assert any("data.data_files[1]: file not found: nowhere.parquet" in p for p in info.value.problems)
    assert any("rollout_worker.custom_rollout_worker_module_path: file not found: worker.py" in p for p in info.value.problems)
    missing_default = write(recipe_tree / "nodefault.yaml", "defaults: [common/nope]\n")
    with pytest.raises(RecipeError, match=r"defaults\[0\]: no common/nope.yaml"):
        load_recipe(missing_default)


def test_cli_validate(recipe_tree):
    good = write(recipe_tree / "good.yaml", "defaults: [common/base]\ndata: {data_files: [train.jsonl]}\n")
    result = run_cli("recipe", "validate", str(good), check=True)
    assert "valid" in result.stdout and "rloo advantages" in " ".join(result.stdout.split())
    bad = write(recipe_tree / "typo.yaml", "trainer: {totl_train_steps: 3}\n")
    result = run_cli("recipe", "validate", str(bad))
    assert result.returncode == 2
    assert "trainer.totl_train_steps: unknown key (did you mean trainer.total_train_steps?)" in result.stderr


def test_publish_refuses_recipe_code_that_does_not_load(recipe_tree):
    recipe = write(
        recipe_tree / "bad_code.yaml",
        """
        data:
          data_files: [train.jsonl]
        rollout_worker:
          evaluator_module_path: missing_eval.py:Judge
        algorithm:
          type: grpo_typo
    """,
    )
    result = run_cli("publish", str(recipe), "--run", "never-created")
    assert result.returncode == 2
    assert "rollout_worker.evaluator_module_path" in result.stderr and "missing_eval.py" in result.stderr
    assert "algorithm.type" in result.stderr and "grpo_typo" in result.stderr


def test_a_custom_workers_own_keys_are_allowed_in_its_section(tmp_path):
    from streamrl.runtime.recipe import RecipeError, load_recipe

    (tmp_path / "w.py").write_text("")
    (tmp_path / "r.yaml").write_text(
        "rollout_worker:\n  custom_rollout_worker_module_path: w.py\n  custom_rollout_worker_class_name: W\n"
        "  use_few_shot: true\n  few_shot: [{question: q, answer: a}]\ntrainer:\n  totl_train_steps: 3\n"
    )
    with pytest.raises(RecipeError) as error:
        load_recipe(tmp_path / "r.yaml")
    assert error.value.problems == ["trainer.totl_train_steps: unknown key (did you mean trainer.total_train_steps?)"]
    (tmp_path / "r.yaml").write_text("rollout_worker:\n  use_few_shot: true\n")
    with pytest.raises(RecipeError, match=re.escape("rollout_worker.use_few_shot: unknown key")):
        load_recipe(tmp_path / "r.yaml")


def test_a_worker_that_declares_its_keys_has_the_others_refused(tmp_path):
    from streamrl.checks import recipe_code_problems
    from streamrl.runtime.recipe import prepare_recipe

    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "w.py").write_text(
        "from streamrl.api import BaseRolloutWorker\n\n"
        "class W(BaseRolloutWorker):\n    config_keys = ('use_few_shot', 'few_shot')\n"
    )
    (tmp_path / "r.yaml").write_text(
        "data: {data_files: [train.jsonl]}\nrollout_worker:\n"
        "  custom_rollout_worker_module_path: w.py:W\n  use_few_shot: true\n"
        "  use_few_shott: true\n"
    )
    problems = recipe_code_problems(prepare_recipe(tmp_path / "r.yaml", run_setup=False))
    assert "rollout_worker.use_few_shott: not one of W.config_keys (use_few_shot, few_shot)" in problems, problems
    assert not any("use_few_shot:" in p for p in problems)


def test_a_trainer_that_declares_its_keys_has_the_others_refused(tmp_path):
    from streamrl.checks import recipe_code_problems
    from streamrl.runtime.recipe import prepare_recipe

    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "t.py").write_text(
        "from streamrl.api import SelfHostedTrainer\n\nclass T(SelfHostedTrainer):\n    config_keys = ('my_param',)\n"
    )
    (tmp_path / "r.yaml").write_text(
        "data: {data_files: [train.jsonl]}\ntrainer: {custom_trainer_module_path: t.py:T}\n"
        "algorithm: {my_param: 0.5, clip_ratio_hgh: 0.3, clip_ratio_high: 0.3}\n"
    )
    problems = recipe_code_problems(prepare_recipe(tmp_path / "r.yaml", run_setup=False))
    assert "algorithm.clip_ratio_hgh: not one of T.config_keys (my_param)" in problems, problems
    assert not any(p.startswith(("algorithm.my_param", "algorithm.clip_ratio_high")) for p in problems)


def test_a_trainer_config_remembers_what_the_trainer_read(tmp_path):
    """The config a guide-style trainer is built with (`cls(config)`) records the own
    `algorithm` keys it reads, at any depth of attribute or item access."""
    from transformers import AutoModelForCausalLM

    from streamrl.api import SelfHostedTrainer
    from streamrl.learner.trainer_factory import build_trainer, unread_trainer_keys
    from streamrl.runtime.config import Recipe
    from streamrl.runtime.tiny_lm import build_tiny_model

    class Reads(SelfHostedTrainer):
        def __init__(self, config):
            super().__init__(config)
            self.scale = config.algorithm.get("my_param", 1.0) * config["algorithm"]["nested"].depth

    recipe = Recipe.from_dict({"algorithm": {"extra": {"my_param": 2.0, "nested": {"depth": 3}, "my_parm": 1.0}}})
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m", max_positions=32))
    trainer = build_trainer(Reads, recipe, model, pad_id=0)
    assert trainer.scale == 6.0 and trainer._config.trainer.lr == recipe.trainer.lr
    assert unread_trainer_keys(trainer, recipe) == ["my_parm"]
    with pytest.raises(AttributeError, match=re.escape("recipe.algorithm config has no key 'missing'")):
        _ = trainer._config.algorithm.missing


def test_a_worker_config_remembers_what_the_worker_read():
    import copy

    from streamrl.runtime.config_reads import WorkerConfig, unread_keys

    config = WorkerConfig({"use_few_shot": True, "few_shot": [], "shots": 3, "temperature": 1.0})
    assert config.use_few_shot is True and config.get("shots") == 3 and "few_shot" not in {"x": 1}
    assert unread_keys(config, ["use_few_shot", "few_shot", "shots"]) == ["few_shot"]
    assert "few_shot" in config and unread_keys(config, ["use_few_shot", "few_shot", "shots"]) == []
    handed_on = WorkerConfig({"a": 1, "b": 2})
    copy.deepcopy(handed_on)  # the whole mapping given on: every key counts as read
    assert unread_keys(handed_on, ["a", "b"]) == []
    assert unread_keys({"a": 1}, ["a"]) == []  # a config the worker built itself is not tracked


def test_choices_come_from_literals_and_registries_and_guide_keys_are_never_ignored(recipe_tree):
    bad = write(
        recipe_tree / "choices.yaml",
        """
        weight: {sync_mode: async}
        service: {train_service: {backend: tinker}, inference_service: {url: "http://gpu:30000"}}
        algorithm: {loss_agg_mode: token_mean, kl_estimator: k9}
    """,
    )
    with pytest.raises(RecipeError) as info:
        load_recipe(bad)
    problems = "\n".join(info.value.problems)
    assert "weight.sync_mode: expected one of sync, batch-async, fully-async, got 'async'" in problems
    # accepted and ignored would be worse
    # a training service for a self-hosted trainer would train nothing there
    from streamrl.runtime.recipe import consistency_problems

    recipe = load_recipe(write(recipe_tree / "service.yaml", "service: {train_service: {backend: tinker, url: 'http://x'}}"))
    assert (
        "service.train_service.backend: tinker is for trainer.type remote_api_grpo or remote_api_cross_entropy "
        "(the trainer is grpo)"
    ) in consistency_problems(recipe)
    # registry keys are checked against what is registered (the CLI imports the components);
    # a key the chosen inference backend would not read is refused
    result = run_cli(
        "recipe",
        "validate",
        str(
            write(
                recipe_tree / "registries.yaml",
                """
        algorithm: {loss_agg_mode: token_mean, kl_estimator: k9}
        service: {inference_service: {backend: vllm}}
    """,
            )
        ),
    )
    assert result.returncode == 2
    err = " ".join(result.stderr.split())
    assert (
        "algorithm.loss_agg_mode: unknown loss aggregation 'token_mean'; known: seq-mean-token-mean, "
        "seq-mean-token-sum, seq-mean-token-sum-norm, token-mean, token-sum (did you mean 'token-mean'?)"
    ) in err
    assert "algorithm.kl_estimator: unknown KL estimator 'k9'; known: abs, k1, k2, k3, k3+" in err
    assert "service.inference_service.backend: unknown inference backend 'vllm'; known: embedded, openai, sglang" in err
    result = run_cli(
        "recipe",
        "validate",
        str(
            write(
                recipe_tree / "url.yaml",
                """
        service: {inference_service: {url: "http://gpu:30000"}}
    """,
            )
        ),
    )
    assert result.returncode == 2
    assert "service.inference_service.url: not used by backend embedded (only by sglang and openai)" in " ".join(
        result.stderr.split()
    )


def test_a_recipes_own_estimator_is_a_valid_algorithm_type(recipe_tree):
    write(
        recipe_tree / "my_adv.py",
        """
        import numpy as np
        from streamrl.algos.advantages import register_advantage

        @register_advantage("centered_sign")
        def centered_sign(rewards):
            return np.sign(rewards - np.mean(rewards))
    """,
    )
    good = write(
        recipe_tree / "own.yaml",
        """
        data: {data_files: [train.jsonl]}
        algorithm: {type: centered_sign, custom_advantage_module_path: my_adv.py}
    """,
    )
    result = run_cli("recipe", "validate", str(good))
    assert result.returncode == 0, result.stderr
    assert "centered_sign advantages" in " ".join(result.stdout.split())


def test_the_typed_recipe_round_trips_through_its_recorded_form(recipe_tree):
    from streamrl.runtime.config import Recipe

    recipe = load_recipe(write(recipe_tree / "rt.yaml", "defaults: [common/base]\ndata: {data_files: [train.jsonl]}\n"))
    assert isinstance(recipe, Recipe) and recipe.algorithm.type == "rloo" and recipe.trainer.lr == 1.0e-4
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    # the recorded form is itself a valid recipe file (benchmarks and replays write it)
    import yaml

    saved = recipe_tree / "saved.yaml"
    saved.write_text(yaml.safe_dump(recipe.to_dict()))
    assert load_recipe(saved) == recipe


def test_a_recorded_config_this_version_cannot_hold_names_its_keys():
    from streamrl.runtime.config import ConfigError, Recipe

    with pytest.raises(ConfigError, match=r"unknown keys trainer\.old_knob, trainer\.older_knob"):
        Recipe.from_dict({"trainer": {"old_knob": 1, "older_knob": 2, "lr": 0.1}})
    # a custom worker's own keys are kept, not refused
    assert Recipe.from_dict({"rollout_worker": {"use_few_shot": True}}).rollout_worker.extra == {"use_few_shot": True}


@pytest.mark.parametrize(
    "algorithm, problem",
    [
        ("{loss_scale_factor: 512}", "algorithm.loss_scale_factor: read only by loss_agg_mode seq-mean-token-sum-norm"),
        ("{loss_agg_mode: seq-mean-token-sum-norm, loss_scale_factor: 0}", "algorithm.loss_scale_factor: must be > 0.0, got 0"),
        ("{type: rloo, grpo_std_epsilon: 1.0e-4}", "algorithm.grpo_std_epsilon: read only by algorithm.type grpo"),
        ("{type: grpo, grpo_std_epsilon: 0}", "algorithm.grpo_std_epsilon: must be in (0.0, 1.0], got 0"),
        ("{type: reinforce_plus_plus, credit_assignment: turn}", "algorithm.credit_assignment: turn needs an estimator"),
        ("{type: grpo, credit_assignment: turn}", "algorithm.credit_assignment: turn acts on multi-turn episodes"),
    ],
)
def test_the_maths_keys_are_refused_where_nothing_reads_them(recipe_tree, algorithm, problem):
    from streamrl.checks import recipe_code_problems
    from streamrl.runtime.recipe import prepare_recipe

    path = write(recipe_tree / "maths.yaml", f"data: {{data_files: [train.jsonl]}}\nalgorithm: {algorithm}\n")
    try:
        problems = recipe_code_problems(prepare_recipe(path, run_setup=False))
    except RecipeError as exc:
        problems = exc.problems
    assert any(p.startswith(problem) for p in problems), problems


def test_dr_grpos_constant_defaults_to_the_generation_budget_and_is_recorded(recipe_tree):
    from streamrl.checks import recipe_code_problems
    from streamrl.runtime.recipe import prepare_recipe

    path = write(
        recipe_tree / "norm.yaml",
        """
        data: {data_files: [train.jsonl]}
        rollout_worker: {max_response_length: 96}
        algorithm: {type: grpo, loss_agg_mode: seq-mean-token-sum-norm, grpo_std_epsilon: 1.0e-4}
    """,
    )
    recipe = prepare_recipe(path, run_setup=False)
    assert recipe_code_problems(recipe) == []
    assert recipe.algorithm.loss_scale_factor == 96.0
    assert recipe.to_dict()["algorithm"]["loss_scale_factor"] == 96.0  # in the run's recorded config


def test_turn_credit_is_refused_with_a_trainer_that_recomputes_episode_advantages():
    from streamrl.checks import estimator_problems
    from streamrl.runtime.config import Recipe

    recipe = Recipe()
    recipe.rollout_worker.type, recipe.algorithm.credit_assignment = "agent", "turn"
    assert estimator_problems(recipe) == []  # the self-hosted grpo trainer keeps per-token advantages
    recipe.trainer.type = "remote_api_grpo"
    assert estimator_problems(recipe)[0].startswith(
        "algorithm.credit_assignment: turn is not kept by trainer RemoteApiGrpoTrainer"
    )


def test_the_policy_loss_keys_earlier_name_is_converted(recipe_tree):
    path = write(recipe_tree / "old_name.yaml", "data: {data_files: [train.jsonl]}\nalgorithm: {off_policy_correction: gspo}\n")
    assert load_recipe(path).algorithm.policy_loss == "gspo"
    both = write(
        recipe_tree / "both.yaml",
        "data: {data_files: [train.jsonl]}\nalgorithm: {off_policy_correction: gspo, policy_loss: truncated_is}\n",
    )
    with pytest.raises(RecipeError, match=re.escape("algorithm.off_policy_correction")):
        load_recipe(both)


def test_validate_refuses_what_run_refuses_for_the_command_lines_mode_and_inference_url():
    """`recipe validate` takes `-m` and `--inference-url` as `run` does: a GRPO recipe
    under -m training-service, or an inference URL with the embedded backend, fail both."""
    recipe = str(REPO / "recipes" / "arith" / "recipe.yaml")
    mode = run_cli("recipe", "validate", recipe, "-m", "training-service", timeout=300)
    assert mode.returncode == 2 and "--mode training-service: trainer.type is grpo" in " ".join(mode.stderr.split())
    url = run_cli("recipe", "validate", recipe, "--inference-url", "127.0.0.1:9", timeout=300)
    assert url.returncode == 2 and "an inference url needs backend sglang or openai" in " ".join(url.stderr.split())
    down = run_cli(
        "recipe",
        "validate",
        str(REPO / "recipes" / "arith" / "sglang.yaml"),
        "--inference-url",
        "127.0.0.1:9",
        "--check-services",
        timeout=300,
    )
    assert down.returncode != 0 and "no answer from http://127.0.0.1:9/health" in " ".join(down.stderr.split())
    fine = run_cli("recipe", "validate", recipe, "-m", "self-hosted", timeout=300)
    assert fine.returncode == 0, fine.stderr
