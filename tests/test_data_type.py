"""`data.type` from the files' extension when unset (the guide's quick start names a
.parquet file and no type); files of several types, or of a type other than the one
named, refused with the files named."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamrl.runtime.dataset import training_rows
from streamrl.runtime.recipe import RecipeError, load_recipe


def write(folder):
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "answer": "2"}]), folder / "train.parquet")
    (folder / "more.jsonl").write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n")
    (folder / "rows.json").write_text("[]")
    (folder / "recipe.yaml").write_text("data: {data_files: [train.parquet]}\n")
    return folder / "recipe.yaml"


def test_a_parquet_file_without_a_type_is_read_as_parquet_and_the_type_recorded(tmp_path):
    recipe = load_recipe(write(tmp_path))
    assert recipe.data.type == "parquet" and recipe.to_dict()["data"]["type"] == "parquet"
    recipe.data.data_files = [str(tmp_path / "train.parquet")]
    assert training_rows(recipe.data) == [{"prompt": "1+1=", "answer": "2"}]


@pytest.mark.parametrize(
    "override, said",
    [
        (
            "data.data_files=[train.parquet,more.jsonl]",
            "data.data_files: files of several types (train.parquet: parquet, more.jsonl: jsonl)",
        ),
        ("data.data_files=[rows.json]", "data.type: auto cannot tell the type of rows.json from its extension"),
        ("data.type=jsonl", "data.type is jsonl, and train.parquet (parquet) is not"),
    ],
)
def test_files_whose_type_cannot_be_one_are_refused_by_name(tmp_path, override, said):
    with pytest.raises(RecipeError) as refused:
        load_recipe(write(tmp_path), [override])
    assert said in str(refused.value)
