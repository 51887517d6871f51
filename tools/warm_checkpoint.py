"""Write the warmed tiny models the learning tests start from: tests/data/<recipe>_warm/.

    python tools/warm_checkpoint.py arith --until 0.6      # what tests/data/arith_warm holds
    python tools/warm_checkpoint.py kv_agent --steps 300   # what tests/data/kv_agent_warm holds
    python tools/warm_checkpoint.py shift --steps 200      # what tests/data/shift_warm holds

The recipe's model (its set-up script builds it), after the recipe's cross-entropy
warm-up: until greedy held-out accuracy reaches --until (checked every 10 steps; a
single-turn recipe), or for --steps steps (the agent recipe's demonstrations). Saved in
float16 (the tests load it as float32): a few hundred KB in git, so a learning test
starts from the same weights on every machine, whatever step the warm-up would cross
the rule's transition at on this one. Prints the held-out accuracy of the saved
(float16-rounded) weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from streamrl.learner.warmup import cross_entropy_warmup, demonstration_items, greedy_exact_match, supervised_items
from streamrl.runtime.chat_template import recipe_renderer
from streamrl.runtime.dataset import read_rows
from streamrl.runtime.quiet import quiet_library_progress
from streamrl.runtime.recipe import prepare_recipe

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    quiet_library_progress()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=["arith", "kv_agent", "shift", "byo_math"])
    parser.add_argument("--until", type=float, help="stop at this greedy held-out accuracy (single-turn recipes)")
    parser.add_argument("--steps", type=int, default=2000, help="the most warm-up steps")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the sums in one order, whatever the machine's cores
    out = REPO / "tests" / "data" / f"{args.recipe}_warm"
    recipe = prepare_recipe(REPO / "recipes" / args.recipe / "recipe.yaml")
    cfg, data, val = recipe.trainer, recipe.data, recipe.validate.data
    folder = recipe.rollout_worker.model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    renderer = recipe_renderer(recipe, tokenizer)
    rows = read_rows(data.data_files, data.type, (data.prompt_key, data.answer_key))
    val_rows = read_rows(val.data_files, val.type)[: val.max_rows or None]

    def accuracy(m) -> float:
        return greedy_exact_match(
            m, renderer, val_rows, val.prompt_key, data.answer_key, recipe.rollout_worker.max_response_length
        )

    if cfg.warmup_messages_key:
        rows = read_rows(data.data_files, data.type, (cfg.warmup_messages_key,))
        items = demonstration_items(rows, renderer, cfg.warmup_messages_key)
    else:
        items = supervised_items(rows, renderer, data.prompt_key, data.answer_key)
    details = cross_entropy_warmup(
        model,
        tokenizer,
        items,
        args.steps,
        cfg.warmup_batch_size,
        dataclasses.replace(cfg, lr=cfg.warmup_lr or cfg.lr),
        cfg.seed,
        done=(lambda: accuracy(model) >= args.until) if args.until is not None else None,
        check_every=10,
    )
    shutil.rmtree(out, ignore_errors=True)
    model.to(torch.float16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"warm-up: {details['warmup_steps']} steps, last loss {details['warmup_last_loss']:.4f}")
    if args.until is not None:
        saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        print(f"held-out accuracy of the saved weights: {accuracy(saved):.3f}")
    print(f"wrote {out} ({size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
