"""Rollout throughput and weight-sync latency: the embedded engine against a managed
SGLang server, on the same model, prompts and sampling, in one run.

    throughput   N prompts (a group of 8 rollouts each), sampled concurrently from as
                 many threads as the worker runs, temperature 1: generated tokens / wall s
    weight sync  a new version folder loaded into the engine (embedded: the state dict
                 read and copied in; SGLang: /update_weights_from_disk, then the probe
                 that checks the version the server reports), median of 5

Usage: python bench/inference_bench.py [--model PATH] [--prompts 256] [--new-tokens 32]
(default model: the built-in recipe's; on a GPU pass --device cuda and a real model folder).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamrl.runtime.quiet import quiet_library_progress

quiet_library_progress()

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams  # noqa: E402
from streamrl.producers.sglang_engine import Server, SGLangEngine  # noqa: E402
from streamrl.producers.sglang_server import ManagedServer  # noqa: E402
from streamrl.runtime.recipe import prepare_recipe  # noqa: E402
from streamrl.runtime.settings import Settings  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def prompts_of(tokenizer, count: int) -> list[list[int]]:
    return [
        tokenizer(f"{a}+{b}=")["input_ids"] for a, b in ((i * 7 % 100, i * 13 % 100) for i in range(count // 8)) for _ in range(8)
    ]


def throughput(engine, prompts: list[list[int]], params: SamplingParams, threads: int) -> float:
    engine.complete(prompts[0], params)  # warm
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        completions = list(pool.map(lambda p: engine.complete(p, params), prompts))
    wall = time.perf_counter() - started
    return sum(len(c.response_token_ids) for c in completions) / wall


def version_folders(model: Path, out: Path, count: int) -> list[Path]:
    folders = []
    base = AutoModelForCausalLM.from_pretrained(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    for index in range(count):
        with torch.no_grad():
            for parameter in base.parameters():
                parameter.mul_(1.0 + 1e-3 * (index + 1))
        folder = out / f"v{index + 1}"
        base.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    return folders


def sync_latency(load, folders: list[Path]) -> float:
    seconds = []
    for version, folder in enumerate(folders, start=1):
        started = time.perf_counter()
        load(str(folder), version)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    model = args.model or Path(prepare_recipe(REPO / "recipes" / "arith" / "recipe.yaml").rollout_worker.model_path)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = prompts_of(tokenizer, args.prompts)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folders = version_folders(model, Path(tmp), 5)
        torch.set_num_threads(1)
        embedded = BatchingEngine(EmbeddedEngine(model, device=args.device), max_batch_size=128)
        results["embedded"] = (
            throughput(embedded, prompts, params, args.threads),
            sync_latency(embedded.engine.load_weights, folders),
        )
        embedded.close()
        managed = ManagedServer(Settings.from_env().sglang_python, str(model), args.device, {}, Path(tmp) / "sglang.log")
        started = time.perf_counter()
        managed.start()
        startup = time.perf_counter() - started
        sglang = SGLangEngine([Server(managed.url, managed=managed)], tokenizer)
        try:
            results["sglang"] = (throughput(sglang, prompts, params, args.threads), sync_latency(sglang.update_weights, folders))
        finally:
            sglang.close()
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU ({args.device})"
    print(f"model {model.name}, {len(prompts)} prompts x {args.new_tokens} new tokens, {args.threads} threads, {device}")
    print(f"{'engine':<10} {'tokens/s':>10} {'weight sync (ms, median of 5)':>30}")
    for name, (tokens_per_s, sync_s) in results.items():
        print(f"{name:<10} {tokens_per_s:>10.0f} {sync_s * 1000:>30.1f}")
    ratio = results["sglang"][0] / results["embedded"][0]
    print(f"sglang / embedded throughput: {ratio:.2f}x; SGLang server start: {startup:.0f} s")


if __name__ == "__main__":
    main()
