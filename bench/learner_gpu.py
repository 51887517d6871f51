"""Learner throughput on a GPU: tokens/s, MFU and peak memory of `GRPOTrainer` on a
randomly initialised Qwen2-0.5B (`runtime.model_init`, the real architecture and size)
in bf16, at 4k and 16k tokens per micro-batch, beside a bare torch loop in the same run.

    streamrl  GRPOTrainer.train: packed micro-batches of `micro_batch_tokens`, bf16
              autocast over fp32 master weights, float32 log-softmax, PPO-clip with
              dual-clip, token-mean over the step's count, entropy and clip metrics,
              grad clipping, AdamW
    bare      the same packed micro-batches through the same model and optimizer: forward
              under bf16 autocast, float32 log-softmax gather, -(A * logp * mask) summed
              over the step's tokens, backward; clip, AdamW. The least a policy-gradient
              step must do.

MFU = 6 x parameters x tokens/s / the GPU's dense bf16 peak (989 TFLOP/s for an H100
SXM); attention's own FLOPs are left out, so it reads low at long contexts.
Usage: python bench/learner_gpu.py [--steps 5] [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamrl.learner.batching import TrainItem
from streamrl.learner.packing import collate_packed, pack_by_tokens
from streamrl.learner.parallel import Placement
from streamrl.learner.trainers import GRPOTrainer, totals_of
from streamrl.runtime.config import Algorithm as AlgorithmConfig
from streamrl.runtime.config import Trainer as TrainerConfig
from streamrl.runtime.model_init import init_model


def make_items(vocab: int, count: int, seed: int = 0) -> list[TrainItem]:
    """Rollout-shaped samples: 128-token prompts, responses of 256 to 1,792 tokens."""
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(count):
        prompt, response = 128, int(rng.integers(256, 1793))
        n = prompt + response
        items.append(
            TrainItem(
                tokens=rng.integers(4, vocab, n).astype(np.int32),
                mask=np.r_[np.zeros(prompt), np.ones(response)].astype(np.uint8),
                behaviour_logprobs=(-rng.random(n) * 3).astype(np.float32),
                advantage=float(rng.normal()),
            )
        )
    return items


def load_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda()


def bare_step(model, optimizer, items, budget: int, pad_id: int, autocast: bool = True) -> None:
    optimizer.zero_grad(set_to_none=True)
    tokens = float(sum(int(i.mask.sum()) for i in items))
    for group in pack_by_tokens([len(i.tokens) for i in items], budget):
        batch = collate_packed([items[i] for i in group], pad_id).to("cuda")
        ids = batch.packed.input_ids
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids, position_ids=batch.packed.position_ids, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        index = batch.packed.unpack_index
        # the packed row's next-token logprobs, back in the padded layout of mask and advantages
        logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], 1)[0][index]
        loss = -(batch.advantages * logp * batch.loss_mask).sum() / tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def timed(fn, steps: int) -> tuple[float, float]:
    """(seconds per step, peak GiB) after one untimed step."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps, torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--only-fsdp", action="store_true", help="Only the FSDP2 rows.")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("learner_gpu: no CUDA device here; skipped (the README has the figures from an H100)")
        return
    folder = init_model("qwen2-0.5b", Path(tempfile.mkdtemp()) / "qwen2-0.5b")
    params = sum(p.numel() for p in load_model(folder).parameters())
    from transformers import AutoTokenizer

    pad_id = AutoTokenizer.from_pretrained(folder).pad_token_id
    items = make_items(len(AutoTokenizer.from_pretrained(folder)), args.samples)
    step_tokens = sum(len(i.tokens) for i in items)
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; qwen2-0.5b, {params / 1e6:.0f}M "
        f"parameters; a step of {len(items)} samples, {step_tokens:,} tokens; bf16 compute, fp32 master weights"
    )
    print(f"{'micro-batch':>12} {'path':>9} {'tok/s':>9} {'MFU':>6} {'peak GiB':>9} {'vs bare':>8}")
    for budget, checkpointing in () if args.only_fsdp else ((4096, False), (16384, False), (16384, True)):
        results = {}
        for name in ("bare", "streamrl"):
            model = load_model(folder)
            model.train()  # as the trainer does: checkpointing acts in training mode only
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if name == "bare":
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
                step = lambda model=model, optimizer=optimizer, budget=budget: bare_step(model, optimizer, items, budget, pad_id)  # noqa: E731
            else:
                trainer = GRPOTrainer(
                    model,
                    pad_id,
                    TrainerConfig(lr=1e-6, micro_batch_tokens=budget, dtype="bfloat16", packing="packed"),
                    AlgorithmConfig(),
                    placement=Placement(torch.device("cuda"), autocast_dtype=torch.bfloat16),
                )
                totals = totals_of(items)
                step = lambda trainer=trainer, totals=totals: trainer.train(items, totals)  # noqa: E731
            try:
                results[name] = timed(step, args.steps)
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                results[name] = None
                print(f"{budget:>12,} {name:>9} out of memory: {str(exc)[:120]}", flush=True)
            model = optimizer = trainer = step = None  # free the memory before the next contender
            torch.cuda.empty_cache()
        label = f"{budget:,}" + (" +ckpt" if checkpointing else "")
        for name, result in results.items():
            if result is None:
                continue
            seconds, memory = result
            rate = step_tokens / seconds
            mfu = 6 * params * rate / (args.peak_tflops * 1e12)
            ratio = f"{results['bare'][0] / seconds:.2f}" if name == "streamrl" and results.get("bare") else ""
            print(f"{label:>12} {name:>9} {rate:>9,.0f} {mfu:>6.1%} {memory:>9.1f} {ratio:>8}", flush=True)
    fsdp_rows(folder, items, step_tokens, params, pad_id, args)
    print("target: streamrl >= 0.9x the bare loop's tokens/s")


def fsdp_rows(folder: Path, items, step_tokens: int, params: int, pad_id: int, args) -> None:
    """The same step with FSDP2 (one rank, nccl): StreamRL's sharded path (learner/parallel.py,
    as several GPUs run it) beside a bare FSDP2 loop with the same mixed-precision policy."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from streamrl.learner.parallel import decoder_layers, prepare_model

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for budget in (4096, 16384):
        results = {}
        for name in ("bare FSDP2", "streamrl FSDP2"):
            model = load_model(folder)
            model.train()
            cfg = TrainerConfig(lr=1e-6, micro_batch_tokens=budget, dtype="bfloat16", packing="packed")
            if name == "bare FSDP2":
                for layer in decoder_layers(model):
                    fully_shard(layer, mp_policy=policy)
                fully_shard(model, mp_policy=policy)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
                step = lambda model=model, optimizer=optimizer, budget=budget: bare_step(  # noqa: E731
                    model, optimizer, items, budget, pad_id, autocast=False
                )
            else:
                placement = Placement(torch.device("cuda"), rank=0, world_size=1, sharded=True)
                model = prepare_model(model, cfg, placement)
                trainer = GRPOTrainer(model, pad_id, cfg, AlgorithmConfig(), placement=placement)
                totals = totals_of(items)
                step = lambda trainer=trainer, totals=totals: trainer.train(items, totals)  # noqa: E731
            try:
                results[name] = timed(step, args.steps)
            except torch.OutOfMemoryError as exc:
                print(f"{budget:>12,} {name:>15} out of memory: {str(exc)[:100]}", flush=True)
            model = optimizer = trainer = step = None
            torch.cuda.empty_cache()
        for name, (seconds, memory) in results.items():
            rate = step_tokens / seconds
            mfu = 6 * params * rate / (args.peak_tflops * 1e12)
            ratio = f"{results['bare FSDP2'][0] / seconds:.2f}" if name.startswith("streamrl") and "bare FSDP2" in results else ""
            print(f"{budget:>12,} {name:>15} {rate:>9,.0f} {mfu:>6.1%} {memory:>9.1f} {ratio:>8}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
