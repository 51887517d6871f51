"""The locally built tiny model and tokenizer load through the real transformers code."""

import hashlib

import pytest
import torch

from recipes.arith.data import arith_row, split_rows, write_jsonl
from runtime.tiny_lm import build_tiny_model, load


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
