"""How long a new weight version takes to reach an SGLang server, by disk and by
broadcast (`weight.transport`), for a `model init` model of a real size (Qwen2-0.5B by
default) on one managed server.

    disk         the learner writes the version's folder (safetensors), then the server
                 loads it (/update_weights_from_disk) and reports the version
    distributed  the learner copies the weights and broadcasts them (gloo on CPU) while
                 the server receives them (/update_weights_from_distributed); the folder
                 is written afterwards, off both paths (timed apart)

Each version perturbs every weight, so each load moves real bytes. Printed: the median
seconds from "the step is done" to "the server serves the version", each way, and their
ratio, from the same run.

    python bench/weight_sync.py [--model qwen2-0.5b] [--versions 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import common  # noqa: F401  (puts the repo on sys.path)
from checkpoint_cost import ensure_model
from common import OUT


def perturb(model, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2-0.5b")
    parser.add_argument("--versions", type=int, default=3)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from streamrl.learner.checkpoint import write_weight_version
    from streamrl.learner.version_writes import cpu_copy
    from streamrl.learner.weight_broadcast import WeightBroadcaster
    from streamrl.producers.sglang_engine import Server, SGLangEngine
    from streamrl.producers.sglang_server import ManagedServer
    from streamrl.runtime.settings import Settings

    folder = ensure_model(args.model)
    work = OUT / "weight_sync"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    print(
        f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters; starting SGLang (CPU engine)",
        flush=True,
    )
    server = ManagedServer(Settings.from_env().sglang_python, str(folder), "cpu", {}, work / "server.log", startup_timeout_s=900)
    server.start()
    engine = SGLangEngine([Server(server.url, managed=server)], tokenizer, sync_timeout_s=900)
    disk, broadcast, background = [], [], []
    try:
        for version in range(1, 2 * args.versions + 1):
            perturb(model, version)
            started = time.perf_counter()
            if version % 2:  # by disk
                written = write_weight_version(work / "weights", version, model, tokenizer)
                engine.update_weights(str(written), version)
                disk.append(time.perf_counter() - started)
            else:
                state = cpu_copy(model.state_dict())
                broadcaster = WeightBroadcaster("127.0.0.1", 2, torch.device("cpu"), timeout_s=900)
                manifest = broadcaster.open(version, state)
                sender = threading.Thread(target=broadcaster.send, args=(manifest, state))
                sender.start()
                engine.update_weights(str(work / "weights" / f"v{version:06d}"), version, broadcast=manifest)
                sender.join()
                broadcast.append(time.perf_counter() - started)
                after = time.perf_counter()
                write_weight_version(work / "weights", version, model, tokenizer, state)
                background.append(time.perf_counter() - after)
            assert engine.broadcast_fallbacks == 0, "a broadcast fell back to the folder"
            print(
                f"version {version}: {'disk' if version % 2 else 'distributed'} {(disk if version % 2 else broadcast)[-1]:.2f} s",
                flush=True,
            )
    finally:
        engine.close()
    d, b = statistics.median(disk), statistics.median(broadcast)
    print(f"\nstep done -> server serves the version ({args.model}, median of {args.versions}):")
    print(f"  disk (baseline)   {d:7.2f} s")
    print(f"  distributed       {b:7.2f} s   ({b / d:.2f}x the disk path's time)")
    print(f"  its folder, written afterwards in the background: {statistics.median(background):.2f} s")


if __name__ == "__main__":
    main()
