"""Set-up script of the key-value agent recipe: makes its data and its model, once.

Writes generated/ next to this file: train.jsonl and val.jsonl (rows with a hidden
database, a question, the answer and a worked demonstration) and model/ (a tiny Qwen2
whose character tokenizer has the chat and tool-call tokens, loaded back through
from_pretrained). Environment: KV_TRAIN_ROWS (default 4000), KV_VAL_ROWS (200), KV_SEED (1).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "agent_workspace"))

from kv_data import make_row  # type: ignore[import-not-found]  # noqa: E402  (agent_workspace/, on the path above)

from streamrl.api import generated_is_current  # noqa: E402


def main() -> None:
    settings = {
        "train_rows": int(os.environ.get("KV_TRAIN_ROWS", "4000")),
        "val_rows": int(os.environ.get("KV_VAL_ROWS", "200")),
        "seed": int(os.environ.get("KV_SEED", "1")),
    }
    out = HERE / "generated"
    if generated_is_current(out, settings):
        return
    # torch and transformers only when there is a model to build: a run starts with this script
    from streamrl.api import build_tiny_model

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(settings["seed"])
    for name, count in (("train", settings["train_rows"]), ("val", settings["val_rows"])):
        with open(out / f"{name}.jsonl", "w") as handle:
            for _ in range(count):
                handle.write(json.dumps(make_row(rng)) + "\n")
    build_tiny_model(out / "model", seed=settings["seed"], max_positions=256)
    (out / "settings.json").write_text(json.dumps(settings))


if __name__ == "__main__":
    main()
