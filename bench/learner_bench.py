"""Learner tokens/s against a bare torch forward+backward loop (target >= 0.9x).

Same model (the recipe's tiny Qwen2, and a wider one), same batch, same optimizer:
    bare      forward, log-softmax gather, -(A * logp * mask).sum() / tokens, backward,
              clip_grad_norm_, AdamW step: the least a policy-gradient step must do
    streamrl  GRPOTrainer.step: collate, token-budget micro-batches, PPO-clip with
              dual-clip, token-mean over the global count, entropy and clip metrics
Rounds alternate between the two, and the best of each is kept, so background noise
hits both alike. One torch thread (as the learner runs on 2 cores).
"""

import tempfile
import time

import common  # noqa: F401  (puts the repo on sys.path)
import numpy as np
import torch

from streamrl.learner.batching import TrainItem, collate
from streamrl.learner.trainers import GRPOTrainer
from streamrl.runtime.config import Algorithm as AlgorithmConfig
from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.tiny_lm import build_tiny_model, load

ROUNDS = 5
STEPS_PER_ROUND = 5


def make_items(vocab: int, count: int, length: int, seed: int = 0) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(count):
        n = int(rng.integers(length // 2, length + 1))
        prompt = n // 4
        items.append(
            TrainItem(
                tokens=rng.integers(4, vocab, n).astype(np.int32),
                mask=np.r_[np.zeros(prompt), np.ones(n - prompt)].astype(np.uint8),
                behaviour_logprobs=(-rng.random(n) * 3).astype(np.float32),
                advantage=float(rng.normal()),
            )
        )
    return items


def bare_step(model, optimizer, batch) -> None:
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.loss_mask[:, 1:]
    loss = -(batch.advantages[:, 1:] * logp * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def measure(hidden: int, count: int, length: int) -> tuple[float, float]:
    directory = build_tiny_model(tempfile.mkdtemp(), seed=0, hidden_size=hidden, max_positions=max(128, length))
    tokenizer, bare_model = load(directory)
    _, ours_model = load(directory)
    items = make_items(len(tokenizer), count, length)
    tokens = sum(int(i.mask.sum()) for i in items)
    bare_optimizer = torch.optim.AdamW(bare_model.parameters(), lr=1e-4)
    trainer = GRPOTrainer(
        ours_model,
        tokenizer.pad_token_id,
        TrainerConfig(lr=1e-4, micro_batch_tokens=10**9, grad_clip=1.0),
        AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean"),
    )
    bare, ours = [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(STEPS_PER_ROUND):
            bare_step(bare_model, bare_optimizer, collate(items, tokenizer.pad_token_id))  # collate in both
        bare.append(STEPS_PER_ROUND * tokens / (time.perf_counter() - start))
        start = time.perf_counter()
        for _ in range(STEPS_PER_ROUND):
            trainer.step(items)
        ours.append(STEPS_PER_ROUND * tokens / (time.perf_counter() - start))
    return max(bare), max(ours)


def main() -> None:
    torch.set_num_threads(1)
    print("learner tokens/s vs a bare torch policy-gradient loop (best of 5 alternating rounds, 1 thread)")
    print(f"{'model / batch':<40} {'bare tok/s':>12} {'streamrl tok/s':>15} {'ratio':>7}")
    for hidden, count, length in [(128, 256, 8), (128, 64, 128), (256, 32, 256)]:
        bare, ours = measure(hidden, count, length)
        label = f"hidden {hidden}, {count} seqs x <= {length} tokens"
        print(f"{label:<40} {bare:>12,.0f} {ours:>15,.0f} {ours / bare:>7.2f}", flush=True)
    print("target: ratio >= 0.9")


if __name__ == "__main__":
    main()
