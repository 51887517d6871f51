"""Bring your own model and data, as the README's command does it: a verl-format parquet
made here (chat-message prompts, the answer in reward_model.ground_truth) given to
recipes/byo_math by overrides, graded by builtin:math, trained end to end on the
embedded engine (recipes/gsm8k covers SGLang: tests/test_gsm8k_recipe.py); and the same file refused by validation
when the answer key names a column it does not have."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from streamrl.recipes.byo_math.setup import verl_row
from tests.conftest import REPO, run_cli

RECIPE = REPO / "recipes" / "byo_math"


def write_dataset(folder) -> list[str]:
    train = [verl_row(a, b, i, "train") for i, (a, b) in enumerate((a, b) for a in range(6) for b in range(6))]
    val = [verl_row(a, b, i, "test") for i, (a, b) in enumerate([(7, 1), (8, 0), (2, 7), (9, 0)])]
    pq.write_table(pa.Table.from_pylist(train * 20), folder / "train.parquet")
    pq.write_table(pa.Table.from_pylist(val), folder / "val.parquet")
    return [f"data.data_files=[{folder / 'train.parquet'}]", f"validate.data.data_files=[{folder / 'val.parquet'}]"]


def train_and_check(ledger, run_id, tmp_path, recipe: str, timeout: float) -> None:
    overrides = write_dataset(tmp_path)
    env = {"BYO_STEPS": "4", "BYO_VALIDATE_EVERY": "4"}
    result = run_cli(
        "run", str(RECIPE / recipe), *overrides, "--run", run_id, "--out", str(tmp_path / "out"), env=env, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    prompt = ledger.execute("select prompt from tasks where run_id = %s and not is_val limit 1", (run_id,)).fetchone()[0]
    assert prompt[0] == {"role": "system", "content": "Answer with the number only."}  # the messages, not a repr
    # the rollouts were rendered with the model's ChatML template
    text = ledger.execute("select prompt_text from trajectories where run_id = %s limit 1", (run_id,)).fetchone()[0]
    assert "What is" in text
    rewards, errors, an_error = ledger.execute(
        "select sum(reward), count(error), min(error) from evaluations where run_id = %s and not is_val", (run_id,)
    ).fetchone()
    assert errors == 0 and rewards > 0, f"builtin:math gave no reward at all ({errors} errors, e.g. {an_error!r})"
    template = ledger.execute("select config->'data'->>'chat_template' from runs where run_id = %s", (run_id,)).fetchone()[0]
    assert template and "<|im_start|>" in template  # the template the run rendered with is recorded


def test_a_verl_parquet_trains_on_the_embedded_engine(stack, ledger, run_id, tmp_path):
    train_and_check(ledger, run_id, tmp_path, "recipe.yaml", timeout=480)


def test_validation_refuses_an_answer_key_the_rows_lack(tmp_path):
    overrides = write_dataset(tmp_path)
    result = run_cli("recipe", "validate", str(RECIPE / "recipe.yaml"), *overrides, "data.answer_key=ground_truth", timeout=300)
    assert result.returncode == 2
    assert f"{tmp_path / 'train.parquet'}: row 1: row has no 'ground_truth'" in result.stdout + result.stderr


def test_validation_refuses_chat_messages_as_raw_text(tmp_path):
    overrides = write_dataset(tmp_path)
    result = run_cli("recipe", "validate", str(RECIPE / "recipe.yaml"), *overrides, "data.apply_chat_template=false", timeout=300)
    assert (
        result.returncode == 2 and "holds chat messages, and data.apply_chat_template is false" in result.stdout + result.stderr
    )


STRICT_TEMPLATE = """{%- for message in messages %}
{%- if loop.index0 > 0 and message.role == messages[loop.index0 - 1].role %}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def test_validation_renders_every_row_and_names_the_rows_the_template_refuses(tmp_path):
    """Two user messages in a row, as in row 3: the template's own message, with the row."""
    overrides = write_dataset(tmp_path)
    rows = [verl_row(1, 2, i, "train") for i in range(5)]
    rows[2]["prompt"] = [{"role": "user", "content": "What is 1 + 2?"}, {"role": "user", "content": "Answer now."}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "strict.jinja").write_text(STRICT_TEMPLATE)
    result = run_cli(
        "recipe",
        "validate",
        str(RECIPE / "recipe.yaml"),
        *overrides,
        f"data.chat_template={tmp_path / 'strict.jinja'}",
        timeout=300,
    )
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, said[-3000:]
    assert f"data.prompt ({tmp_path / 'train.parquet'}): the chat template refused 1 of 5 prompts: row 3:" in said, said[-3000:]
    assert "Conversation roles must alternate user/assistant/user/assistant/..." in said


def test_validation_counts_and_names_prompts_longer_than_max_prompt_length(tmp_path):
    overrides = write_dataset(tmp_path)
    result = run_cli("recipe", "validate", str(RECIPE / "recipe.yaml"), *overrides, "data.max_prompt_length=40", timeout=300)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, said[-3000:]
    # 720 training rows, each prompt 71 tokens: the system message, the question and the template's markers
    assert (
        f"data.prompt ({tmp_path / 'train.parquet'}): 720 of 720 prompts are longer than max_prompt_length (40 tokens" in said
    ), said[-3000:]
    assert "row 1 (" in said and "validate.data.prompt" in said


def test_filter_overlong_prompts_leaves_out_the_training_rows_over_the_limit_and_says_how_many(tmp_path):
    """verl's data.filter_overlong_prompts: the rows over the limit are counted at validate
    and recorded with the run (data.skip_rows), and every process's rows leave them out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamrl.runtime.dataset import total_train_steps, training_rows
    from streamrl.runtime.recipe import prepare_recipe

    overrides = write_dataset(tmp_path)
    long = verl_row(1, 2, 0, "train")
    long["prompt"][1]["content"] = "What is 1 + 2? " + "Think it over. " * 40
    rows = [verl_row(a, b, i, "train") for i, (a, b) in enumerate([(1, 1), (2, 2), (3, 3)])]
    pq.write_table(pa.Table.from_pylist([rows[0], long, rows[1], long, rows[2]]), tmp_path / "mixed.parquet")
    settings = [f"data.data_files=[{tmp_path / 'mixed.parquet'}]", overrides[1], "data.max_prompt_length=100"]
    refused = run_cli("recipe", "validate", str(RECIPE / "recipe.yaml"), *settings, timeout=300)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2 and "2 of 5 prompts are longer than max_prompt_length (100 tokens" in said, said[-3000:]
    assert "or leave them out with data.filter_overlong_prompts: true" in said

    filtered = [*settings, "data.filter_overlong_prompts=true", "trainer.total_epochs=2", "trajectory_pool.batch_size=1"]
    result = run_cli("recipe", "validate", str(RECIPE / "recipe.yaml"), *filtered, timeout=300)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, said[-3000:]
    assert (
        "data.filter_overlong_prompts: 2 training rows have prompts longer than 100 tokens and are left out (first: row 2)"
        in said
    )
    recipe = prepare_recipe(RECIPE / "recipe.yaml", run_setup=False, overrides=filtered)
    assert recipe.data.skip_rows == [1, 3] and recipe.to_dict()["data"]["skip_rows"] == [1, 3]  # recorded with the run
    assert [r["reward_model"]["ground_truth"] for r in training_rows(recipe.data)] == ["2", "4", "6"]
    assert total_train_steps(recipe) == 6  # 2 epochs of the 3 rows kept, one a step


LENGTHS = """
import json, sys
from streamrl.runtime.dataset import read_rows
from streamrl.runtime.prompt_lengths import prompt_lengths
from streamrl.runtime.recipe import prepare_recipe
from streamrl.checks import recipe_code_problems
recipe = prepare_recipe(sys.argv[1], overrides=sys.argv[2:])
rows = read_rows(recipe.data.data_files, recipe.data.type, prompt_keys=(recipe.data.prompt_key,))
lengths = prompt_lengths(recipe, rows, recipe.data.prompt_key)
assert recipe_code_problems(recipe) == [], recipe_code_problems(recipe)  # the whole check `run` makes
print(json.dumps({"lengths": lengths, "rendered": "transformers" in sys.modules}))
"""


def test_prompt_lengths_are_rendered_once_and_again_when_the_template_or_tokenizer_files_change(tmp_path):
    """A run checks its prompts' lengths before it starts: the same rows, tokenizer files and
    template are read from STREAMRL_HOME's cache, so that the whole check (`run`'s, before
    it starts the run) does not import transformers; a changed template or tokenizer file
    renders them again."""
    import json
    import shutil
    import subprocess
    import sys

    overrides = write_dataset(tmp_path)
    env = {"STREAMRL_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}

    def lengths(*more: str) -> dict:
        args = [sys.executable, "-c", LENGTHS, str(RECIPE / "recipe.yaml"), *overrides, *more]
        done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])

    first, second = lengths(), lengths()
    assert first["rendered"] and not second["rendered"]
    assert first["lengths"] == second["lengths"] and set(first["lengths"]) == {71}  # the validation test's 71 tokens
    (tmp_path / "wordy.jinja").write_text("{% for m in messages %}Said: {{ m['content'] }}\n{% endfor %}")
    templated = lengths(f"data.chat_template={tmp_path / 'wordy.jinja'}")
    assert templated["rendered"] and set(templated["lengths"]) != {71}
    (tmp_path / "wordy.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")  # the same path
    rewritten = lengths(f"data.chat_template={tmp_path / 'wordy.jinja'}")
    assert rewritten["rendered"] and set(rewritten["lengths"]) != set(templated["lengths"])
    model = tmp_path / "model"
    shutil.copytree(REPO / "recipes" / "byo_math" / "generated" / "model", model)
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    changed = lengths(f"rollout_worker.model_path={model}")
    assert changed["rendered"] and set(changed["lengths"]) != {71}
