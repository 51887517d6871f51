"""recipes/gsm8k: verl's GSM8K GRPO settings as a StreamRL recipe. The settings verl's
script passes on its command line, given as verl spells them, load to the same recipe as
the file (the ones StreamRL cannot honour refused, each with its reason); and the recipe
runs end to end on its stand-in (a random tiny Qwen2 with Qwen's real tokenizer, rows in
verl's GSM8K format) with rollouts from a managed SGLang server, scored by verl's GSM8K
rule, with verl's metric names in the ledger."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl.runtime.recipe import RecipeError, load_recipe, run_setup_script
from tests.conftest import REPO, run_cli

RECIPE = REPO / "recipes" / "gsm8k" / "recipe.yaml"

# verl's examples/grpo_trainer/run_qwen2-7b.sh, the settings StreamRL takes as verl writes
# them (data files and model path left to the recipe's stand-in)
VERL_COMMAND_LINE = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.truncation=error",
    "data.filter_overlong_prompts=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.project_name=verl_grpo_example_gsm8k",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]
# the script's settings StreamRL refuses, with the reason it gives
VERL_REFUSED = {
    "actor_rollout_ref.actor.ppo_mini_batch_size=256": "one optimizer step over the whole step's batch",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40": "trainer.micro_batch_tokens",
    "actor_rollout_ref.rollout.name=vllm": "vLLM is not an inference backend here",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False": "a verl key StreamRL has no equivalent of",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40": "a verl key StreamRL has no equivalent of",
    "algorithm.adv_estimator=gae": "'gae' has no StreamRL equivalent",
}


@pytest.fixture(scope="module")
def stand_in():
    run_setup_script(RECIPE)
    return RECIPE


def test_verls_command_line_loads_to_the_recipe_as_written(stand_in):
    as_written = load_recipe(stand_in).to_dict()
    with_verl_keys = load_recipe(stand_in, VERL_COMMAND_LINE).to_dict()
    assert with_verl_keys == as_written


@pytest.mark.parametrize("override, reason", list(VERL_REFUSED.items()))
def test_verl_settings_streamrl_cannot_honour_are_refused_with_the_reason(stand_in, override, reason):
    with pytest.raises(RecipeError, match=None) as refused:
        load_recipe(stand_in, [override])
    assert override.split("=")[0] in str(refused.value) and reason in str(refused.value)


def test_validate_refuses_rows_whose_data_source_has_no_rule(stand_in, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamrl.recipes.gsm8k.setup import verl_gsm8k_row

    rows = [verl_gsm8k_row(__import__("random").Random(i), i, "train") for i in range(5)]
    rows[3]["data_source"] = "my/own-data"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "recipe",
            "validate",
            str(stand_in),
            f"data.data_files=[{tmp_path}/train.parquet]",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join((result.stdout + result.stderr).split())
    assert "data_source, rows 4 (1 of 5): builtin:verl has no reward rule for data_source 'my/own-data'" in out
    assert "known: openai/gsm8k" in out


def test_the_stand_in_trains_end_to_end_on_sglang(stack, ledger, run_id, tmp_path, sglang_python, stand_in):
    env = {"GSM8K_BATCH": "4", "GSM8K_RESPONSE_LENGTH": "24", "GSM8K_STEPS": "2", "GSM8K_VAL_ROWS": "8"}
    server = ["service.inference_service.server_args={max-total-tokens: 16384, max-running-requests: 64}"]
    result = run_cli("run", str(stand_in), *server, "--run", run_id, "--out", str(tmp_path / "out"), env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = ledger.execute("select count(*) from train_steps where run_id = %s", (run_id,)).fetchone()[0]
    assert steps == 2
    rollouts, errors, rules = ledger.execute(
        "select count(*), count(error), array_agg(distinct extra_info->>'rule') from evaluations where run_id = %s", (run_id,)
    ).fetchone()
    assert rollouts >= 2 * 4 * 5 and errors == 0 and rules == ["gsm8k"]
    ids, prompt_length = ledger.execute(
        "select streamrl_int32s(tokens), prompt_length from trajectories where run_id = %s and error is null limit 1", (run_id,)
    ).fetchone()
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(stand_in.parent / "generated" / "model").decode(ids[:prompt_length])
    assert prompt.startswith("<|im_start|>user\n") and prompt.endswith('after "####".<|im_end|>\n<|im_start|>assistant\n')
    # token alignment on the SGLang path: every response starts where sampling started,
    # its logprobs on exactly its own positions
    layouts = ledger.execute(
        "select prompt_length, streamrl_uint8s(loss_mask), streamrl_float32s(logprobs) from trajectories "
        "where run_id = %s and error is null",
        (run_id,),
    ).fetchall()
    for length, mask, logprobs in layouts:
        assert mask == [0] * length + [1] * (len(mask) - length) and len(mask) > length
        assert all(lp == 0 for lp in logprobs[:length]) and all(lp <= 0 for lp in logprobs[length:])
    metrics = ledger.execute("select metrics from train_steps where run_id = %s order by step limit 1", (run_id,)).fetchone()[0]
    assert metrics["response_length/max"] <= 24 and 0 <= metrics["response_length/clip_ratio"] <= 1  # verl's names
    assert {"critic/score/mean", "groups/zero_std_share", "timing_s/step", "perf/rollout_tokens_per_s"} <= set(metrics)
    config = ledger.execute("select config from runs where run_id = %s", (run_id,)).fetchone()[0]
    assert config["algorithm"]["kl_ctrl"]["kl_coef"] == 0.001 and config["trainer"]["lr"] == 1e-6
