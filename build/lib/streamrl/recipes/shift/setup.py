"""Set-up script of the shift recipe: makes its data and its model, once.

Writes generated/ next to this file (not committed): train.jsonl, val.jsonl and a tiny
Qwen2 with a byte-level tokenizer (saved with save_pretrained, loaded back by the run
through AutoModelForCausalLM / AutoTokenizer.from_pretrained).

Environment: SHIFT_LENGTH (letters a prompt, default 52), SHIFT_TRAIN_ROWS (default
5000), SHIFT_VAL_ROWS (default 100), SHIFT_SEED (default 1). Re-running with the same
settings changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent

from streamrl.recipes.arith.data import write_generated  # noqa: E402
from streamrl.recipes.shift.data import split_rows  # noqa: E402


def main() -> None:
    settings = {
        "length": int(os.environ.get("SHIFT_LENGTH", "52")),
        "train_rows": int(os.environ.get("SHIFT_TRAIN_ROWS", "5000")),
        "val_rows": int(os.environ.get("SHIFT_VAL_ROWS", "100")),
        "seed": int(os.environ.get("SHIFT_SEED", "1")),
    }
    write_generated(
        HERE / "generated" / f"len{settings['length']}",
        settings,
        lambda: split_rows(settings["train_rows"], settings["val_rows"], settings["seed"], settings["length"]),
    )


if __name__ == "__main__":
    main()
