"""A GRPO step through the training service vs the same step in the self-hosted learner,
in one run: the overhead of the remote path (datums, protobuf, HTTP, the request ledger,
the durable state after each optimizer step), in ms and as a ratio.

    self-hosted   GRPOTrainer.step on the batch, in this process
    service       RemotePolicy's path: forward_backward(ppo) + optim_step through the
                  official tinker client to a `streamrl serve-training` on this machine

Same model (the built-in recipe's tiny Qwen2, full fine-tuning), same batch (B sequences
of T tokens, half of them trained), same device (CPU here; `--device cuda` on a GPU
machine). The median of ROUNDS steps is reported; the service's first step (model
creation) is not timed.

    python bench/remote_step.py [--batch 256] [--tokens 12] [--rounds 15] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from common import OUT, bench_settings

from streamrl.learner.batching import TrainItem
from streamrl.learner.remote_trainers import service_datums
from streamrl.learner.trainers import GRPOTrainer
from streamrl.runtime.config import Recipe
from streamrl.runtime.tiny_lm import build_tiny_model

PORT = 18141


def batch(size: int, tokens: int, vocab: int, seed: int = 0) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    items = []
    for i in range(size):
        ids = rng.integers(4, vocab, tokens).astype(np.int32)
        mask = np.r_[np.zeros(tokens // 2), np.ones(tokens - tokens // 2)].astype(np.uint8)
        items.append(
            TrainItem(
                tokens=ids,
                mask=mask,
                behaviour_logprobs=np.full(tokens, -2.0, np.float32) * mask,
                advantage=float(rng.normal()),
                group_id=f"g{i // 8}",
            )
        )
    return items


def local_steps(model_dir: Path, items: list[TrainItem], rounds: int, device: str) -> list[float]:
    from transformers import AutoModelForCausalLM

    recipe = Recipe.from_dict({"trainer": {"micro_batch_tokens": 16384}})
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    trainer = GRPOTrainer(model, 0, recipe.trainer, recipe.algorithm)
    times = []
    for _ in range(rounds + 1):
        started = time.perf_counter()
        trainer.step(list(items))
        times.append(time.perf_counter() - started)
    return times[1:]


def service_steps(model_dir: Path, items: list[TrainItem], rounds: int, device: str) -> list[float]:
    import tinker
    from tinker import types

    key = subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "training-key", "create", "bench"], check=True, capture_output=True, text=True
    ).stdout.split()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "serve-training",
            "--model",
            f"bench={model_dir}",
            "--port",
            str(PORT),
            "--device",
            device,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{PORT}"
        for _ in range(600):
            try:
                if httpx.get(f"{url}/api/v1/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        client = tinker.ServiceClient(base_url=url, api_key=key)
        trainer = client.create_lora_training_client(base_model="bench", rank=0).result()
        times = []
        for _ in range(rounds + 1):
            started = time.perf_counter()
            data = service_datums(items, "ppo", "token-mean")
            backward = trainer.forward_backward(data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
            step = trainer.optim_step(types.AdamParams(learning_rate=1e-4, grad_clip_norm=1.0))
            backward.result()
            step.result()
            times.append(time.perf_counter() - started)
        client.close("success").result()
        return times[1:]
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    bench_settings()
    torch.set_num_threads(1)
    model_dir = build_tiny_model(OUT / "remote_step_model")
    items = batch(args.batch, args.tokens, vocab=90)
    local = statistics.median(local_steps(model_dir, items, args.rounds, args.device)) * 1000
    remote = statistics.median(service_steps(model_dir, items, args.rounds, args.device)) * 1000
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"GRPO step, {args.batch} x {args.tokens} tokens, tiny Qwen2, {device} (median of {args.rounds})")
    print(f"  self-hosted learner   {local:8.1f} ms   (baseline)")
    print(f"  training service      {remote:8.1f} ms   overhead {remote - local:+.1f} ms, ratio {remote / local:.2f}x")


if __name__ == "__main__":
    main()
