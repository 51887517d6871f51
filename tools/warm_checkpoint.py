"""Write the warmed tiny model the learning tests start from: tests/data/arith_warm/.

    python tools/warm_checkpoint.py [--until 0.5]

The arith recipe's model (its set-up script builds it, seed 1), after the recipe's
cross-entropy warm-up until greedy held-out accuracy reaches --until (checked every 10
steps). Saved in float16 (the tests load it as float32): a few hundred KB in git, so a
learning test starts from the same weights on every machine, whatever step the warm-up
would cross the rule's transition at on this one. Prints the held-out accuracy of the
saved (float16-rounded) weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from streamrl.runtime.quiet import quiet_library_progress

quiet_library_progress()

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.learner.warmup import cross_entropy_warmup, greedy_exact_match, supervised_items
from streamrl.runtime.chat_template import recipe_renderer
from streamrl.runtime.dataset import read_rows
from streamrl.runtime.recipe import prepare_recipe

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "arith_warm"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--until", type=float, default=0.5)
    parser.add_argument("--max-steps", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the sums in one order, whatever the machine's cores
    recipe = prepare_recipe(REPO / "recipes" / "arith" / "recipe.yaml")
    cfg, data, val = recipe.trainer, recipe.data, recipe.validate.data
    folder = recipe.rollout_worker.model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    renderer = recipe_renderer(recipe, tokenizer)
    rows = read_rows(data.data_files, data.type, (data.prompt_key, data.answer_key))
    val_rows = read_rows(val.data_files, val.type)[: val.max_rows or None]

    def accuracy(m) -> float:
        return greedy_exact_match(m, renderer, val_rows, val.prompt_key, data.answer_key, recipe.rollout_worker.max_response_length)

    details = cross_entropy_warmup(
        model,
        tokenizer,
        supervised_items(rows, renderer, data.prompt_key, data.answer_key),
        args.max_steps,
        cfg.warmup_batch_size,
        dataclasses.replace(cfg, lr=cfg.warmup_lr or cfg.lr),
        cfg.seed,
        done=lambda: accuracy(model) >= args.until,
        check_every=10,
    )
    shutil.rmtree(OUT, ignore_errors=True)
    model.to(torch.float16).save_pretrained(OUT)
    tokenizer.save_pretrained(OUT)
    saved = AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32)
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"warm-up: {details['warmup_steps']} steps; held-out accuracy of the saved weights: {accuracy(saved):.3f}")
    print(f"wrote {OUT} ({size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
