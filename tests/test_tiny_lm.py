"""The locally built tiny model and tokenizer load through the real transformers code."""

import hashlib

import pytest
import torch

from streamrl.recipes.arith.data import arith_row, split_rows, write_jsonl
from streamrl.runtime.tiny_lm import build_tiny_model, load


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def state_digest(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.numpy().tobytes())
    return digest.hexdigest()


def test_round_trip_through_from_pretrained(model_dir, tmp_path):
    tokenizer, model = load(model_dir)
    assert model.config.vocab_size == len(tokenizer)  # no id the tokenizer cannot decode
    ids = tokenizer("37+48=5")["input_ids"]
    assert len(ids) == 7 and tokenizer.decode(ids) == "37+48=5"  # one token per character
    assert tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None
    again = build_tiny_model(tmp_path / "again", seed=3)
    assert state_digest(load(again)[1]) == state_digest(model)  # same seed, same weights


def test_the_model_samples_and_scores_tokens(model_dir):
    tokenizer, model = load(model_dir)
    prompt = torch.tensor([tokenizer("1+2=")["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(prompt, max_new_tokens=3, do_sample=True, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (1, 7) and int(out.max()) < len(tokenizer)
    logits = model(out).logits
    assert logits.shape == (1, 7, len(tokenizer))


def test_arith_rows(tmp_path):
    assert arith_row(37, 48, "last_digit")["answer"] == "5"
    assert arith_row(37, 48, "sum") == {"prompt": "37+48=", "answer": "85", "a": 37, "b": 48, "variant": "sum"}
    with pytest.raises(ValueError, match="unknown arithmetic variant 'product'"):
        arith_row(1, 2, "product")
    train, val = split_rows(500, 100, seed=1)
    assert len(train) == 500 and len(val) == 100
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}  # held out
    path = write_jsonl(val, tmp_path / "val.jsonl")
    assert len(path.read_text().splitlines()) == 100


def texts_of(value):
    """Every string in a row (prompts, answers, chat messages, databases), keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from texts_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from texts_of(item)


def test_every_byte_of_every_built_in_recipes_texts_survives_encode_and_decode():
    """The built-in recipes' rows, as their set-up scripts write them, through their own
    models' tokenizers: nothing unknown, no whitespace lost."""
    from transformers import AutoTokenizer

    from streamrl.runtime.dataset import read_rows
    from streamrl.runtime.recipe import prepare_recipe
    from tests.conftest import REPO

    for recipe_file in ("arith/recipe.yaml", "kv_agent/recipe.yaml", "byo_math/recipe.yaml"):
        recipe = prepare_recipe(REPO / "recipes" / recipe_file)  # runs the set-up script
        tokenizer = AutoTokenizer.from_pretrained(recipe.rollout_worker.model_path)
        files = recipe.data.data_files + recipe.validate.data.data_files
        rows = read_rows(recipe.data.data_files, recipe.data.type) + read_rows(
            recipe.validate.data.data_files, recipe.validate.data.type
        )
        checked = 0
        for text in {t for row in rows for t in texts_of(row)}:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert tokenizer.unk_token_id not in ids or tokenizer.unk_token_id is None, (recipe_file, text)
            assert tokenizer.decode(ids) == text, (recipe_file, text)
            checked += 1
        assert checked > 100, (recipe_file, files)


def test_a_generated_model_of_an_older_version_is_rebuilt(tmp_path):
    """A recipe's set-up script keeps what it generated while the settings and the model
    version match, and rebuilds a model stamped by an older version."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from streamrl.runtime.builtin_families import BUILTIN_MODEL_VERSION, STAMP_FILE
    from tests.conftest import REPO

    shutil.copy(REPO / "recipes" / "byo_math" / "setup.py", tmp_path / "setup.py")

    def run():
        subprocess.run(
            [sys.executable, str(tmp_path / "setup.py")],
            check=True,
            capture_output=True,
            env={**os.environ, "BYO_TRAIN_ROWS": "50", "PYTHONPATH": str(REPO)},
        )

    run()
    stamp, weights = tmp_path / "generated" / "model" / STAMP_FILE, tmp_path / "generated" / "model" / "model.safetensors"
    assert json.loads(stamp.read_text())["version"] == BUILTIN_MODEL_VERSION
    built = weights.stat().st_mtime_ns
    run()
    assert weights.stat().st_mtime_ns == built  # current: kept
    stamp.write_text(json.dumps({"version": BUILTIN_MODEL_VERSION - 1, "family": "chatml"}))
    run()
    assert weights.stat().st_mtime_ns != built and json.loads(stamp.read_text())["version"] == BUILTIN_MODEL_VERSION
