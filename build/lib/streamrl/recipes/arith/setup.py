"""Set-up script of the arithmetic recipe: makes its data and its model, once.

Writes, next to this file (in generated/, not committed):
    train.jsonl, val.jsonl   generated rows (held-out validation prompts)
    model/                   a tiny Qwen2 with a character tokenizer, saved with
                             save_pretrained and loaded back by the run through
                             AutoModelForCausalLM / AutoTokenizer.from_pretrained

Environment: ARITH_VARIANT (last_digit | sum), ARITH_MAX_OPERAND (default 99),
ARITH_TRAIN_ROWS (default 5000), ARITH_VAL_ROWS (default 200), ARITH_SEED (default 1).
Re-running with the same settings changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

from streamrl.recipes.arith.data import split_rows, write_generated  # noqa: E402


def main() -> None:
    settings: dict[str, Any] = {
        "variant": os.environ.get("ARITH_VARIANT", "last_digit"),
        "max_operand": int(os.environ.get("ARITH_MAX_OPERAND", "99")),
        "train_rows": int(os.environ.get("ARITH_TRAIN_ROWS", "5000")),
        "val_rows": int(os.environ.get("ARITH_VAL_ROWS", "200")),
        "seed": int(os.environ.get("ARITH_SEED", "1")),
    }
    write_generated(
        HERE / "generated" / settings["variant"],
        settings,
        lambda: split_rows(
            settings["train_rows"], settings["val_rows"], settings["seed"], settings["variant"], settings["max_operand"]
        ),
    )


if __name__ == "__main__":
    main()
