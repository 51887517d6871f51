"""Generated arithmetic tasks: nothing to download, answers known exactly.

Variants:
    last_digit   "37+48=" -> "5"    the last digit of a + b (easy: a one-token answer)
    sum          "37+48=" -> "85"   the whole sum (harder: carries, several tokens)

Operands are zero-padded to a fixed width ("07+48="), so every digit has a fixed
position: a 2-layer model then learns which positions matter in a few hundred steps,
where variable widths cost it thousands.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

VARIANTS = ("last_digit", "sum")


def arith_row(a: int, b: int, variant: str, width: int = 2) -> dict:
    if variant == "last_digit":
        answer = str((a + b) % 10)
    elif variant == "sum":
        answer = str(a + b)
    else:
        raise ValueError(f"unknown arithmetic variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    return {"prompt": f"{a:0{width}d}+{b:0{width}d}=", "answer": answer, "a": a, "b": b, "variant": variant}


def arith_rows(count: int, seed: int, variant: str = "last_digit", max_operand: int = 99) -> list[dict]:
    rng = random.Random(seed)
    width = len(str(max_operand))
    return [arith_row(rng.randint(0, max_operand), rng.randint(0, max_operand), variant, width) for _ in range(count)]


def split_rows(
    count: int, val_count: int, seed: int, variant: str = "last_digit", max_operand: int = 99
) -> tuple[list[dict], list[dict]]:
    """Train and held-out validation rows with no prompt in common."""
    rows = arith_rows(count + 4 * val_count, seed, variant, max_operand)
    seen: set[str] = set()
    train: list[dict] = []
    val: list[dict] = []
    for row in rows:
        if row["prompt"] in seen:
            continue
        seen.add(row["prompt"])
        (val if len(val) < val_count else train).append(row)
    return train[:count], val


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_generated(out: Path, settings: dict, make_rows) -> None:
    """A built-in recipe's generated folder: train.jsonl and val.jsonl from
    `make_rows()`, a tiny model seeded with settings["seed"], and the settings that made
    them. Nothing is rewritten when the folder was made with the same settings."""
    from streamrl.api import generated_is_current

    if generated_is_current(out, settings):
        return
    # torch and transformers only when there is a model to build: a run starts with a set-up script
    from streamrl.api import build_tiny_model

    train, val = make_rows()
    write_jsonl(train, out / "train.jsonl")
    write_jsonl(val, out / "val.jsonl")
    build_tiny_model(out / "model", seed=settings["seed"])
    (out / "settings.json").write_text(json.dumps(settings))
