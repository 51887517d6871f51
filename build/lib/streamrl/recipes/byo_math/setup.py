"""Set-up script of the bring-your-own recipe's stand-in model and data, made once.

When the recipe runs with its defaults, this writes what a user would bring, in their
formats, next to this file (generated/, not committed):

    train.parquet, val.parquet   rows as verl's data preprocessing writes them: `prompt` a
                                 list of chat messages (system + user), the answer in
                                 `reward_model.ground_truth`, the rest in `extra_info`
    model/                       a randomly initialised tiny Qwen2 (`streamrl model init
                                 tiny-qwen2`): a Hugging Face folder whose tokenizer has
                                 a ChatML chat template, as an instruct model's has

A recipe given your own model folder and parquet files (README: "Bring your own model
and data") never reads these. Environment: BYO_TRAIN_ROWS (default 2000), BYO_SEED (1).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

from streamrl.api import generated_is_current  # noqa: E402

SYSTEM = "Answer with the number only."


def verl_row(a: int, b: int, index: int, split: str) -> dict:
    return {
        "data_source": "streamrl/sums",
        "ability": "math",
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}],
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index},
    }


def main() -> None:
    settings = {"train_rows": int(os.environ.get("BYO_TRAIN_ROWS", "2000")), "seed": int(os.environ.get("BYO_SEED", "1"))}
    out = HERE / "generated"
    if generated_is_current(out, settings):
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamrl.runtime.model_init import init_model  # torch only when there is a model to build

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(settings["seed"])
    pairs = [(a, b) for a in range(10) for b in range(10)]
    held_out = set(rng.sample(pairs, 20))
    train = [verl_row(*rng.choice([p for p in pairs if p not in held_out]), i, "train") for i in range(settings["train_rows"])]
    val = [verl_row(a, b, i, "test") for i, (a, b) in enumerate(sorted(held_out))]
    pq.write_table(pa.Table.from_pylist(train), out / "train.parquet")
    pq.write_table(pa.Table.from_pylist(val), out / "val.parquet")
    init_model("tiny-qwen2", out / "model", seed=settings["seed"], match_tokenizer_vocab=True, dtype="float32")
    (out / "settings.json").write_text(json.dumps(settings))


if __name__ == "__main__":
    main()
