"""Peak memory of one GRPO step at Qwen2's vocabulary: the output layer in chunks
(learner/output_head.py, the learner's default) against the full [B, T, V] logits, in
the same run (target: at most 40% of the full step's memory).

A random-initialised Qwen2 of a small width with Qwen2's 151,936-token vocabulary, 8
samples of 512 tokens (one 64-token prompt, 448 response tokens each: a group), float32 on
the CPU, `GRPOTrainer.step` with everything else at its defaults. Each variant runs in a
fresh process: its peak resident memory (ru_maxrss) minus what the process held with the
model built and before the step, so torch's import and the weights count in neither.

    python bench/learner_memory.py [--hidden 256] [--samples 8] [--length 512]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import common  # noqa: F401  (puts the repo on sys.path)

VOCAB = 151_936


def measure(chunked: bool, hidden: int, samples: int, length: int) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from streamrl.learner.batching import TrainItem
    from streamrl.learner.trainers import GRPOTrainer
    from streamrl.runtime.config import Algorithm as AlgorithmConfig
    from streamrl.runtime.config import Trainer as TrainerConfig

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, VOCAB, 64).tolist()
    items = []
    for index in range(samples):
        tokens = np.array(prompt + rng.integers(0, VOCAB, length - 64).tolist(), np.int32)
        mask = np.array([0] * 64 + [1] * (length - 64), np.uint8)
        logprobs = np.full(length, -11.9, np.float32)
        items.append(TrainItem(tokens, mask, logprobs, advantage=float(index % 2) - 0.5, group_id="g", trajectory_id=str(index)))
    trainer = GRPOTrainer(model, 0, TrainerConfig(lr=1e-6, micro_batch_tokens=samples * length), AlgorithmConfig())
    trainer.chunk_output = chunked
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = trainer.step(items)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"step_mib": (peak - before) / 1024, "loss": result.loss, "tokens": result.tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--variant", choices=["full", "chunked"], help=argparse.SUPPRESS)  # one measurement, in a child
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant == "chunked", args.hidden, args.samples, args.length)))
        return
    shape = ["--hidden", str(args.hidden), "--samples", str(args.samples), "--length", str(args.length)]
    print(f"one GRPO step, vocabulary {VOCAB:,}, {args.samples} x {args.length} tokens, hidden {args.hidden}, float32, CPU")
    figures = {}
    for variant in ("full", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--variant", variant, *shape], capture_output=True, text=True, check=True)
        figures[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {variant:8s} step peak {figures[variant]['step_mib']:8.0f} MiB  loss {figures[variant]['loss']:.6f}")
    share = figures["chunked"]["step_mib"] / figures["full"]["step_mib"]
    verdict = "met" if share <= 0.4 else "missed"
    print(f"  chunked / full: {share:.2f} (target <= 0.40: {verdict})")


if __name__ == "__main__":
    main()
