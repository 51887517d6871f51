"""Set-up script of the GSM8K recipe: a stand-in model and data set, made only when the
user names none (GSM8K_MODEL, GSM8K_DATA unset), next to this file (generated/, not
committed):

    data/train.parquet, data/test.parquet
        rows exactly as verl's `examples/data_preprocess/gsm8k.py` writes them
        (data_source openai/gsm8k, the question and verl's "####" instruction as the
        user message, reward_model.ground_truth, extra_info), their questions
        GSM8K-like sums, since GSM8K itself cannot be downloaded here
    model/
        a randomly initialised tiny Qwen2 with Qwen's real vocabulary and tokenizer
        (`streamrl model tokenizer --name qwen`, from the dashscope wheel's qwen.tiktoken)

With GSM8K_MODEL and GSM8K_DATA set, it makes nothing. Environment: GSM8K_TRAIN_ROWS
(default 512), GSM8K_SEED (1).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
# verl's instruction (examples/data_preprocess/gsm8k.py), appended to every question
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis"]


def verl_gsm8k_row(rng: random.Random, index: int, split: str) -> dict:
    name, first, second = rng.choice(NAMES), rng.randint(2, 60), rng.randint(2, 60)
    question = f"{name} sold {first} clips in April and {second} clips in May. How many clips did {name} sell altogether?"
    answer = f"{name} sold {first}+{second} = <<{first}+{second}={first + second}>>{first + second} clips.\n#### {first + second}"
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(first + second)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def write_data(out: Path, rows: int, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", rows), ("test", 64)):
        table = [verl_gsm8k_row(rng, i, split) for i in range(count)]
        pq.write_table(pa.Table.from_pylist(table), out / f"{split}.parquet")


def write_model(out: Path, seed: int) -> None:
    from streamrl.runtime.model_init import init_model
    from streamrl.runtime.shipped_tokenizers import write_shipped_tokenizer

    tokenizer = write_shipped_tokenizer("qwen", out.parent / "qwen_tokenizer")
    init_model("tiny-qwen2", out, seed=seed, tokenizer_folder=tokenizer, dtype="float32")


def main() -> None:
    settings = {"train_rows": int(os.environ.get("GSM8K_TRAIN_ROWS", "512")), "seed": int(os.environ.get("GSM8K_SEED", "1"))}
    out = HERE / "generated"
    stamp = out / "settings.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == settings and (out / "model" / "config.json").is_file():
        return
    if not os.environ.get("GSM8K_DATA"):
        write_data(out / "data", settings["train_rows"], settings["seed"])
    if not os.environ.get("GSM8K_MODEL"):
        write_model(out / "model", settings["seed"])
    if not os.environ.get("GSM8K_DATA") and not os.environ.get("GSM8K_MODEL"):
        stamp.write_text(json.dumps(settings))


if __name__ == "__main__":
    main()
