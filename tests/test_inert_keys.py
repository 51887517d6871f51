"""Keys that nothing reads in a recipe's combination are refused with the reason
(runtime/inert_keys.py); the remote trainer's request split and metric merge."""

from __future__ import annotations

import pytest

from streamrl.learner.remote_trainers import merged_metrics, request_chunks
from streamrl.runtime.config import Recipe
from streamrl.runtime.inert_keys import inert_key_problems
from tests.conftest import REPO, run_cli

REMOTE = {"trainer": {"type": "remote_api_grpo"}}


def problems(values: dict) -> list[str]:
    """On top of the defaults, as a recipe file is read (runtime.recipe.load_recipe)."""
    from omegaconf import OmegaConf

    merged = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(Recipe().to_dict()), OmegaConf.create(values)))
    return inert_key_problems(Recipe.from_dict(merged))


@pytest.mark.parametrize(
    "values, refused",
    [
        ({"validate": {"data": {"shuffle": True}}}, "validate.data.shuffle: True does nothing here"),
        ({"validate": {"data": {"seed": 7}}}, "validate.data.seed: 7 does nothing here"),
        ({"validate": {"data": {"max_prompt_length": 64}}}, "validate.data.max_prompt_length: 64"),
        ({"data": {"max_rows": 10}}, "data.max_rows: 10"),
        ({"algorithm": {"kl_estimator": "k1"}}, "algorithm.kl_estimator: 'k1' does nothing here: read only with"),
        ({"algorithm": {"kl_ctrl": {"kl_coef": 0.1}}}, "algorithm.kl_ctrl.kl_coef: 0.1 does nothing here"),
        ({"service": {"inference_service": {"max_retries": 5}}}, "service.inference_service.max_retries: 5"),
        ({"service": {"inference_service": {"request_timeout_s": 5.0}}}, "service.inference_service.request_timeout_s"),
        ({**REMOTE, "algorithm": {"clip_ratio_high": 0.4}}, "algorithm.clip_ratio_high: 0.4 does nothing here: a remote"),
        ({**REMOTE, "algorithm": {"policy_loss": "truncated_is"}}, "algorithm.policy_loss: 'truncated_is'"),
        ({**REMOTE, "trainer": {"type": "remote_api_grpo", "dtype": "bfloat16"}}, "trainer.dtype: 'bfloat16'"),
        (
            {**REMOTE, "trainer": {"type": "remote_api_grpo", "gradient_checkpointing": True}},
            "trainer.gradient_checkpointing: True",
        ),
        ({**REMOTE, "trainer": {"type": "remote_api_grpo", "lora": {"rank": 4}}}, "trainer.lora: "),
        ({"weight": {"sync_mode": "sync", "staleness_threshold": 3}}, "weight.staleness_threshold: 3 does nothing here"),
        ({"trainer": {"warmup_check_every": 20}}, "trainer.warmup_check_every: 20 does nothing here: read only with"),
        ({"trainer": {"warmup_until_accuracy": 0.3}}, "trainer.warmup_until_accuracy: 0.3 does nothing here: the learner"),
    ],
)
def test_a_key_nothing_reads_in_its_combination_is_refused(values, refused):
    found = problems(values)
    assert len(found) == 1 and found[0].startswith(refused), found


@pytest.mark.parametrize(
    "values",
    [
        {"validate": {"data": {"shuffle": False, "seed": 42}}},  # the defaults, spelt out
        {"algorithm": {"use_kl_loss": True, "kl_estimator": "k1", "kl_ctrl": {"kl_coef": 0.1}}},
        {"algorithm": {"use_kl_in_reward": True, "kl_ctrl": {"type": "adaptive", "target_kl": 2.0}}},
        {"service": {"inference_service": {"backend": "sglang", "max_retries": 5, "request_timeout_s": 5.0}}},
        {**REMOTE, "algorithm": {"clip_ratio_high": 0.4}, "service": {"train_service": {"config": {"loss_fn": "ppo"}}}},
        {"algorithm": {"clip_ratio_high": 0.4, "policy_loss": "truncated_is"}, "trainer": {"dtype": "bfloat16"}},
        {"weight": {"sync_mode": "fully-async", "staleness_threshold": 3}},
    ],
)
def test_the_same_keys_are_accepted_where_they_act(values):
    assert problems(values) == []


def test_validate_names_the_key_and_the_reason():
    result = run_cli(
        "recipe",
        "validate",
        str(REPO / "recipes" / "arith" / "recipe.yaml"),
        "weight.sync_mode=sync",
        "weight.staleness_threshold=2",
        timeout=120,
    )
    said = " ".join(result.stdout.split() + result.stderr.split())
    assert result.returncode != 0 and "weight.staleness_threshold: 2 does nothing here" in said, said


def test_requests_are_split_by_tokens_and_a_long_datum_goes_alone():
    assert request_chunks([3, 4, 2, 9, 1, 1], 7) == [[0, 1], [2], [3], [4, 5]]
    assert request_chunks([5, 5], 10) == [[0, 1]]
    assert request_chunks([], 10) == []


def test_request_metrics_merge_by_their_reduction():
    merged = merged_metrics(
        [
            {"loss:sum": 1.5, "ratio:max": 2.0, "kl:mean": 0.1},
            {"loss:sum": 2.5, "ratio:max": 3.0, "kl:mean": 0.3, "clip:min": 0.5},
        ]
    )
    assert merged == pytest.approx({"loss:sum": 4.0, "ratio:max": 3.0, "kl:mean": 0.2, "clip:min": 0.5})


SGLANG = {"service": {"inference_service": {"backend": "sglang"}}}


@pytest.mark.parametrize(
    "values, refused",
    [
        (
            {"weight": {"transport": "distributed"}},
            "needs SGLang servers (service.inference_service.backend sglang; this recipe's is embedded)",
        ),
        ({**SGLANG, "weight": {"transport": "distributed", "sync_mode": "batch-async"}}, "which batch-async forbids"),
        (
            {
                "service": {"inference_service": {"backend": "sglang", "url": ["a:1", "b:2"]}},
                "rollout_worker": {"num_workers": 2},
                "weight": {"transport": "distributed"},
            },
            "every worker would join the same servers",
        ),
        (
            {
                "service": {"inference_service": {"backend": "sglang", "server_args": {"dp-size": 2}}},
                "weight": {"transport": "distributed"},
            },
            "tensor-parallel ranks only (server_args dp-size > 1)",
        ),
        ({"weight": {"broadcast_address": "10.0.0.5"}}, "weight.broadcast_address: read only with weight.transport distributed"),
        (
            {
                "service": {"inference_service": {"backend": "sglang", "server_args": {"tp-size": "two"}}},
                "weight": {"transport": "distributed"},
            },
            "server_args.tp-size: 'two' is not a whole number",
        ),
    ],
)
def test_weight_transport_distributed_is_refused_where_a_broadcast_cannot_work(values, refused):
    from omegaconf import OmegaConf

    from streamrl.runtime.weight_transport import transport_problems

    merged = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(Recipe().to_dict()), OmegaConf.create(values)))
    found = transport_problems(Recipe.from_dict(merged))
    assert any(refused in problem for problem in found), found


def test_the_broadcast_group_counts_every_server_rank_of_every_worker():
    from streamrl.runtime.weight_transport import broadcast_world_size

    recipe = Recipe.from_dict(
        {
            **Recipe().to_dict(),
            "rollout_worker": {"num_workers": 3},
            "service": {"inference_service": {"backend": "sglang", "num_servers": 2, "server_args": {"tp-size": 4}}},
        }
    )
    assert broadcast_world_size(recipe) == 1 + 3 * 2 * 4
    assert transport_problems_of(recipe) == []


def transport_problems_of(recipe) -> list[str]:
    from dataclasses import replace

    from streamrl.runtime.weight_transport import transport_problems

    return transport_problems(replace(recipe, weight=replace(recipe.weight, transport="distributed")))
