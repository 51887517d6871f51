"""Publisher scheduling (pure) and dataset loading errors."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamrl.producers.publisher import Pacing, pacing_for, step_tasks, validation_tasks, validation_versions
from streamrl.runtime.config import Recipe
from streamrl.runtime.dataset import DatasetError, epoch_batches, lookup, read_rows, total_train_steps, validation_rows


def test_pacing_keeps_at_most_k_plus_one_steps_in_flight():
    sync, async2 = Pacing(10, 0), Pacing(10, 2)
    assert [sync.min_version(s) for s in (1, 2, 3)] == [0, 1, 2]  # on-policy: step s needs version s - 1
    assert [async2.min_version(s) for s in (1, 2, 3, 4, 5)] == [0, 0, 0, 1, 2]


def test_validation_versions():
    recipe = Recipe.from_dict(
        {"validate": {"validate_before_train": True, "data": {"data_files": ["v.jsonl"]}, "eval": {"compute_interval": 4}}}
    )
    assert validation_versions(recipe, 10) == [0, 4, 8, 10]
    recipe.validate.validate_before_train = False
    assert validation_versions(recipe, 8) == [4, 8]


def test_with_a_version_every_three_steps_pacing_and_validation_count_versions():
    # versions 0, 3, 6, ...: the learner about to train step s has published the newest
    # multiple of 3 at or before s - 1; one version of staleness is 3 steps
    async_pacing, sync_pacing = Pacing(12, staleness=1, sync_every=3), Pacing(12, staleness=0, sync_every=3)
    assert [async_pacing.min_version(s) for s in range(1, 11)] == [0, 0, 0, 0, 0, 0, 3, 3, 3, 6]
    assert [sync_pacing.min_version(s) for s in range(1, 11)] == [0, 0, 0, 3, 3, 3, 6, 6, 6, 9]
    recipe = Recipe.from_dict(
        {"weight": {"sync_every": 3}, "validate": {"data": {"data_files": ["v.jsonl"]}, "eval": {"compute_interval": 2}}}
    )
    assert validation_versions(recipe, 14) == [0, 6, 12, 14]  # every 2 versions, and the last
    assert pacing_for(recipe, 100).sync_every == 3


def test_step_tasks_repeat_each_prompt_group_size_times():
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    tasks = step_tasks("run", 3, rows, group_size=4, prompt_key="prompt", min_weight_version=2)
    assert len(tasks) == 8
    assert {t.group_id for t in tasks} == {"s000003-g0000", "s000003-g0001"}
    assert [t.sample_index for t in tasks[:4]] == [0, 1, 2, 3]
    assert len({t.event_id for t in tasks}) == 8  # distinct, deterministic ids
    assert all(t.step == 3 and t.min_weight_version == 2 and not t.is_val for t in tasks)
    assert step_tasks("run", 3, rows, 4, "prompt", 2)[0].event_id == tasks[0].event_id
    val = validation_tasks("run", 5, rows, "prompt")
    assert [t.is_val for t in val] == [True, True] and val[0].min_weight_version == 5


def test_epoch_batches_cover_every_row_once_per_epoch():
    rows = [{"i": i} for i in range(10)]
    batches = epoch_batches(rows, 4, shuffle=True, seed=1)
    first = [next(batches) for _ in range(5)]  # 20 rows = 2 epochs
    seen = [r["i"] for _, batch in first for r in batch]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert [epoch for epoch, _ in first] == [0, 0, 1, 1, 1]  # the third batch spans the epochs
    again = epoch_batches(rows, 4, shuffle=True, seed=1)
    assert [next(again)[1] for _ in range(5)] == [b for _, b in first]  # deterministic


def test_dataset_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"prompt": "1+1="}\n{"prompt": oops}\n')
    with pytest.raises(DatasetError, match=r"train.jsonl:2: not valid JSON"):
        read_rows([str(bad)])
    bad.write_text('{"prompt": "1+1="}\n{"question": "2+2="}\n')
    with pytest.raises(DatasetError, match=r"train.jsonl:2: row has no 'prompt'"):
        read_rows([str(bad)], required_keys=("prompt",))
    with pytest.raises(DatasetError, match="data file not found"):
        read_rows([str(tmp_path / "missing.jsonl")])


def test_validation_scores_the_first_max_rows_or_every_row_of_a_shorter_file(tmp_path):
    """`streamrl run` waits for this many scores at the last version: a 20-row file under
    max_rows 200 is 20 (it waited for 200, then gave up after 180 s)."""
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    assert len(validation_rows([str(path)], "jsonl", 200)) == 20
    assert [row["answer"] for row in validation_rows([str(path)], "jsonl", 3)] == ["1", "2", "3"]
    assert len(validation_rows([str(path)], "jsonl", None)) == 20 and validation_rows([], "jsonl", 200) == []


def test_parquet_rows(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}), path)
    assert read_rows([str(path)], "parquet", ("prompt",)) == [
        {"prompt": "1+1=", "answer": "2"},
        {"prompt": "2+2=", "answer": "4"},
    ]


def test_a_runs_length_is_one_function_that_counts_epochs(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}"}}\n' for i in range(10)))
    recipe = Recipe.from_dict(
        {
            "data": {"data_files": [str(data)]},
            "trajectory_pool": {"batch_size": 4},
            "trainer": {"total_train_steps": 100, "total_epochs": 1},
        }
    )
    # one pass over 10 rows at 4 prompts a step: ceil(10 / 4) = 3 steps, not 100
    assert total_train_steps(recipe) == 3
    assert pacing_for(recipe, 10).total_steps == 3  # the publisher's count is the same
    recipe.trainer.total_epochs = 2
    assert total_train_steps(recipe) == 5  # ceil(20 / 4)
    recipe.trainer.total_epochs = None
    assert total_train_steps(recipe) == 100


def verl_rows() -> list[dict]:
    """Rows as verl's data preprocessing writes them: a chat-message prompt, the answer
    nested in reward_model, the rest in extra_info."""
    return [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": "What is 6 * 7?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "42"},
            "extra_info": {"split": "train", "index": 0},
        },
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "5"},
            "extra_info": {"split": "train", "index": 1},
        },
    ]


def test_verl_rows_read_alike_from_parquet_jsonl_and_a_datasets_folder(tmp_path):
    import datasets

    rows = verl_rows()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "train_hf"))
    keys = dict(required_keys=("reward_model.ground_truth",), prompt_keys=("prompt",))
    for name, kind in (("train.parquet", "parquet"), ("train.jsonl", "jsonl"), ("train_hf", "hf")):
        read = read_rows([str(tmp_path / name)], kind, **keys)
        assert [r["prompt"] for r in read] == [r["prompt"] for r in rows], kind
        assert [lookup(r, "reward_model.ground_truth") for r in read] == ["42", "5"], kind


def test_a_bad_prompt_or_an_unreachable_key_is_refused_with_its_file_row_and_key(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows()), path)
    with pytest.raises(
        DatasetError,
        match=r"train.parquet: row 1: row has no 'reward_model.answer' "
        r"\('reward_model' has no 'answer'\)",
    ):
        read_rows([str(path)], "parquet", ("reward_model.answer",))
    with pytest.raises(DatasetError, match=r"train.parquet: row 1: row has no 'question'"):
        read_rows([str(path)], "parquet", prompt_keys=("question",))
    # a number, a mapping, a message without content: none is a prompt
    for prompt, why in (
        (7, "holds a int"),
        ({"role": "user"}, "holds a dict"),
        ([{"role": "user", "content": 3}], "message 0 \\(user\\) has content of type int"),
        ([{"role": "robot", "content": "hi"}], "message 0 has role 'robot'"),
    ):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": prompt}) + "\n")
        with pytest.raises(DatasetError, match=rf"bad.jsonl:2: 'prompt' {why}"):
            read_rows([str(bad)], prompt_keys=("prompt",))


def test_published_tasks_carry_the_rows_chat_messages_not_their_repr():
    rows = verl_rows()
    tasks = step_tasks("r", 1, rows, 2, "prompt", 0)
    assert tasks[0].prompt == rows[0]["prompt"] and isinstance(tasks[0].prompt, list)
    nested = [{"q": {"text": "2+2="}}]
    assert step_tasks("r", 1, nested, 1, "q.text", 0)[0].prompt == "2+2="
