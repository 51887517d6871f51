"""Small models taught one behaviour by full fine-tuning (`fine_tune`), for tests that
need a model that does something on purpose: tinker-cookbook's RL loop, and the guide's
LLM-judge evaluator.

The task and warmed model for running tinker-cookbook's loops against the service:

The cookbook's RL loop rewards `\\boxed{ANSWER}` against a GSM8K-style `#### ANSWER`; a
randomly initialised model never writes `\\boxed{`, every group scores 0, and the loop
skips every optimiser step. So the model is first taught the format here (full
fine-tuning in plain torch on the conversations the loop will render), to the point
where it writes the format and copies the digit only sometimes: groups then score
unevenly and the loop's GRPO steps train.

The tests start from committed copies (about a minute and a half to make the two):
`python -m tests.helpers.fine_tune` writes tests/data/boxed_warm (the cookbook's model)
and tests/data/judge_warm (the LLM judge), in float16 like the recipes' warmed models
(tests/helpers/warm_model.py loads them as float32)."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

# The RL loop's few-shot prefix and question suffix (tinker_cookbook/recipes/rl_loop.py).
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."
STRAWBERRY = [
    {"role": "user", "content": "How many r's are in strawberry?" + SUFFIX},
    {
        "role": "assistant",
        "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w "
        "6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}",
    },
]


def question(digit: int) -> str:
    return f"Copy the digit {digit}."


def write_datasets(folder: Path, rows: int, seed: int = 0) -> tuple[Path, Path]:
    """`chat.jsonl` (the SL loop's `messages` rows, as HuggingFaceH4/no_robots has them)
    and `gsm8k.jsonl` (the RL loop's `question` / `answer` rows, as openai/gsm8k has them)."""
    rng = random.Random(seed)
    chat, gsm8k = folder / "chat.jsonl", folder / "gsm8k.jsonl"
    with chat.open("w") as chat_file, gsm8k.open("w") as gsm8k_file:
        for _ in range(rows):
            digit = rng.randint(0, 9)
            messages = [
                {"role": "user", "content": question(digit) + SUFFIX},
                {"role": "assistant", "content": f"\\boxed{{{digit}}}"},
            ]
            chat_file.write(json.dumps({"messages": messages}) + "\n")
            gsm8k_file.write(json.dumps({"question": question(digit), "answer": f"It is {digit}.\n#### {digit}"}) + "\n")
    return chat, gsm8k


def warm_up(model_folder: Path, out: Path, steps: int, seed: int = 0) -> Path:
    """Fine-tune `model_folder` on the RL loop's prompts answered `\\boxed{d}`; write `out`."""

    def examples(rng: random.Random) -> list[tuple[list[dict], str]]:
        digits = [rng.randint(0, 9) for _ in range(8)]
        return [([*STRAWBERRY, {"role": "user", "content": question(d) + SUFFIX}], f"\\boxed{{{d}}}") for d in digits]

    return fine_tune(model_folder, out, examples, steps, seed=seed)


def fine_tune(model_folder: Path, out: Path, examples, steps: int, lr: float = 3e-3, seed: int = 0) -> Path:
    """Full fine-tuning in plain torch: `examples(rng)` gives a batch of (chat messages,
    the assistant's answer); the loss is on the answer and its end-of-turn token only."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        batch = examples(rng)
        prompt_ids = [
            tokenizer(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False
            )["input_ids"]
            for messages, _ in batch
        ]
        answer_ids = [tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"] for _, answer in batch]
        width = max(len(p) + len(a) for p, a in zip(prompt_ids, answer_ids))
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (p, a) in enumerate(zip(prompt_ids, answer_ids)):
            ids[row, : len(p) + len(a)] = torch.tensor(p + a)
            labels[row, len(p) : len(p) + len(a)] = torch.tensor(a)
            mask[row, : len(p) + len(a)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def judge_examples(rng: random.Random) -> list[tuple[list[dict], str]]:
    """Any question, answered "0.5": a judge that scores every answer half right."""
    words = ["Question", "Answer", "Reference", "Student", "score", "the", "is", "2+3", "5", "correct", "Evaluate"]
    return [
        ([{"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(3, 80)))}], "0.5") for _ in range(8)
    ]


def main() -> None:
    from streamrl.runtime.model_init import init_model
    from tests.helpers.warm_model import DATA

    torch.set_num_threads(1)  # the sums in one order, whatever the machine's cores
    with tempfile.TemporaryDirectory() as scratch:
        base = init_model("tiny-qwen2", Path(scratch) / "base", seed=0, dtype="float32")
        boxed = warm_up(base, Path(scratch) / "boxed", steps=150)
        judge_base = init_model("tiny-qwen2", Path(scratch) / "judge-base", match_tokenizer_vocab=True, dtype="float32")
        judge = fine_tune(judge_base, Path(scratch) / "judge", judge_examples, steps=120)
        for folder, name in ((boxed, "boxed_warm"), (judge, "judge_warm")):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16)
            model.save_pretrained(DATA / name)
            AutoTokenizer.from_pretrained(folder).save_pretrained(DATA / name)
            print("wrote", DATA / name)


if __name__ == "__main__":
    main()
