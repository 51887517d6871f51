"""Learner tokens/s with 1 and 2 processes (torchrun, FSDP2 over gloo on the CPU),
against a bare FSDP2 loop on the same model, batch and ranks (target >= 0.9x).

    streamrl  learner/policy.py: rank 0 plans the step (shares by tokens, the same
              number of packed micro-batches on every rank), broadcasts it, each rank
              trains its share (GRPO loss, metrics all-reduced), AdamW
    bare      fully_shard on each decoder layer and the root, each rank the same share of
              the same packed micro-batches: forward, float32 log-softmax gather,
              -(A * logp * mask) over the step's tokens, backward, clip, AdamW

Each process has one torch thread (2 cores here). The driver starts torchrun once per
process count and prints both paths side by side.
Usage: python bench/learner_ranks.py [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamrl.runtime.quiet import quiet_library_progress

quiet_library_progress()

from streamrl.learner.batching import TrainItem  # noqa: E402

HIDDEN, LAYERS, SAMPLES, LENGTH = 256, 4, 32, 256


def make_items(vocab: int) -> list[TrainItem]:
    rng = np.random.default_rng(0)
    items = []
    for _ in range(SAMPLES):
        n = int(rng.integers(LENGTH // 2, LENGTH + 1))
        items.append(
            TrainItem(
                tokens=rng.integers(4, vocab, n).astype(np.int32),
                mask=np.r_[np.zeros(n // 4), np.ones(n - n // 4)].astype(np.uint8),
                behaviour_logprobs=(-rng.random(n) * 3).astype(np.float32),
                advantage=float(rng.normal()),
            )
        )
    return items


def rank_main(model_dir: str, steps: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from streamrl.learner.packing import collate_packed
    from streamrl.learner.parallel import broadcast_object, decoder_layers
    from streamrl.learner.policy import Policy
    from streamrl.learner.trainers import GRPOTrainer, plan_step
    from streamrl.runtime.config import Recipe

    torch.set_num_threads(1)
    recipe = Recipe.from_dict(
        {
            "rollout_worker": {"model_path": model_dir},
            "trainer": {"lr": 1e-5, "micro_batch_tokens": 1024, "device": "cpu", "packing": "packed"},
        }
    )
    policy = Policy(recipe, GRPOTrainer, Path(tempfile.mkdtemp()) / "checkpoints")
    items = make_items(len(policy.tokenizer))
    tokens = sum(len(i.tokens) for i in items)
    rank, world = policy.placement.rank, policy.placement.world_size

    def time_steps(step) -> float:
        step()
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if world > 1:
            dist.barrier()
        return steps * tokens / (time.perf_counter() - start)

    def ours():
        if policy.is_main:
            policy.call("train", 1e-5, items=items)
        else:  # one operation, as `follow` would run it
            name, args = broadcast_object(None, policy.placement)
            getattr(policy, name)(*args)

    ours_rate = time_steps(ours)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if world > 1:
        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    plan = plan_step(items, world, policy.trainer.micro_batches)
    share = plan.shares[rank]
    groups = policy.trainer.micro_batches(share)

    def bare():
        optimizer.zero_grad(set_to_none=True)
        for g in range(plan.rounds):
            batch = collate_packed([share[i] for i in groups[min(g, len(groups) - 1)]], policy.tokenizer.pad_token_id)
            ids = batch.packed.input_ids
            logits = model(input_ids=ids, position_ids=batch.packed.position_ids, use_cache=False).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], 1)[0][batch.packed.unpack_index]
            weight = 1.0 if g < len(groups) else 0.0
            loss = -(batch.advantages * logp * batch.loss_mask).sum() * weight * world / plan.totals.tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    bare_rate = time_steps(bare)
    if policy.is_main:  # the followers ran each operation by hand above: no stop to send
        Path(out).write_text(json.dumps({"streamrl": ours_rate, "bare": bare_rate}))
    policy.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rank", nargs=3, metavar=("MODEL", "STEPS", "OUT"))
    args = parser.parse_args()
    if args.rank:
        rank_main(args.rank[0], int(args.rank[1]), args.rank[2])
        return
    from streamrl.runtime.tiny_lm import build_tiny_model

    model_dir = build_tiny_model(tempfile.mkdtemp(), seed=0, hidden_size=HIDDEN, layers=LAYERS, max_positions=LENGTH * 8)
    print(
        f"learner tokens/s on the CPU, one thread per process: a Qwen2 of hidden {HIDDEN}, {LAYERS} layers; "
        f"{SAMPLES} samples of <= {LENGTH} tokens a step, packed micro-batches of 1,024 tokens"
    )
    print(f"{'processes':>10} {'bare FSDP2 tok/s':>17} {'streamrl tok/s':>15} {'ratio':>6}")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    for n in (1, 2):
        out = Path(tempfile.mkdtemp()) / "rates.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={n}",
                __file__,
                "--rank",
                str(model_dir),
                str(args.steps),
                str(out),
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        rates = json.loads(out.read_text())
        print(
            f"{n:>10} {rates['bare']:>17,.0f} {rates['streamrl']:>15,.0f} {rates['streamrl'] / rates['bare']:>6.2f}", flush=True
        )
    print("target: ratio >= 0.9")


if __name__ == "__main__":
    main()
