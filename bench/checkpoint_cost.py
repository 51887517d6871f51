"""What keeping a learner restartable costs a step, before and after sharded background
snapshots: `model init` models of real sizes (Qwen2-0.5B full fine-tuning, Qwen2-1.5B
with LoRA by default; `:adapter` is LoRA whose weight versions are the adapter alone),
the learner's own Policy, a few identical GRPO steps.

    off     no snapshot, no weight version: the step alone
    before  what the learner did before: every step, the whole model and AdamW state
            torch.save'd on rank 0, and a full weight version written, both on the path
    after   what it does now: a weight version every step copied on the path and written
            in the background; a sharded snapshot (torch.distributed.checkpoint
            async_save) every --save-freq steps, waited for only if still writing
    sync3   as after, with a weight version every --save-freq steps (weight.sync_every)

Each configuration runs in its own process (its peak RSS is its own). Printed per step:
the step's own time, the time the step waits for checkpoints and versions, the bytes
written, and the process's peak host memory.

    python bench/checkpoint_cost.py [--models qwen2-0.5b:full,qwen2-1.5b:lora] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common  # noqa: F401  (puts the repo on sys.path)
import numpy as np
from common import OUT

MODES = ("off", "before", "after")
# and `sync3`: as after, with a weight version every --save-freq steps (weight.sync_every)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def step_items(vocab: int, step: int):
    from streamrl.learner.batching import TrainItem

    rng = np.random.default_rng(step)
    return [
        TrainItem(
            tokens=rng.integers(10, vocab, 32).astype(np.int32),
            mask=np.r_[np.zeros(8), np.ones(24)].astype(np.uint8),
            behaviour_logprobs=np.full(32, -3.0, np.float32),
            advantage=float(rng.normal()),
            trajectory_id=f"{step}-{i}",
            group_id="g",
        )
        for i in range(2)
    ]


def old_full_checkpoint(policy, folder: Path) -> None:
    """The learner's checkpoint before sharded snapshots: everything through rank 0, synchronously."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": policy.model.state_dict(), "optimizer": policy.trainer.optimizer.state_dict()}, folder / "checkpoint.pt")


def child(model: str, kind: str, mode: str, steps: int, save_freq: int, work: Path) -> dict:
    from streamrl.learner.policy import Policy
    from streamrl.learner.trainers import GRPOTrainer
    from streamrl.runtime.config import Recipe

    trainer = {"lr": 1e-5, "micro_batch_tokens": 64, "device": "cpu", "num_threads": 2}
    if kind in ("lora", "adapter"):  # adapter: weight versions are the adapter alone (trainer.lora.versions)
        trainer["lora"] = {"rank": 16, "alpha": 32.0, "versions": "merged" if kind == "lora" else "adapter"}
    recipe = Recipe.from_dict({"rollout_worker": {"model_path": model}, "trainer": trainer})
    policy = Policy(recipe, GRPOTrainer, work / "checkpoints")
    vocab = len(policy.tokenizer)
    step_seconds, waits, deleted = [], [], 0
    for step in range(1, steps + 1):
        started = time.perf_counter()
        policy.train(1e-5, step_items(vocab, step))
        trained = time.perf_counter()
        if mode == "before":
            old_full_checkpoint(policy, work / "old" / f"step-{step:06d}")
            policy.write_version(work / "weights", step)
        elif mode in ("after", "sync3"):  # as learner/loop.py does it
            policy.finish_checkpoint(wait=False)
            if mode == "after" or step % save_freq == 0:
                policy.start_version(work / "weights", step)
            if step % save_freq == 0:
                policy.finish_checkpoint(wait=True)
                policy.write_checkpoint(step, {"offsets": {}}, keep_every=0)
            policy.written_versions()
        step_seconds.append(trained - started)
        waits.append(time.perf_counter() - trained)
        deleted += prune(work, keep=2)  # the disk holds a few steps' files, as the learner's pruning keeps it
    if mode in ("after", "sync3"):  # what is still in flight finishes off the path
        policy.finish_checkpoint(wait=True)
        policy.written_versions(wait=True)
    policy.close()
    written = (folder_bytes(work) if work.exists() else 0) + deleted
    return {
        "model": Path(model).name,
        "kind": kind,
        "mode": mode,
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "step_s": float(np.median(step_seconds)),
        "wait_s": float(np.mean(waits)),
        "bytes_per_step": written / steps,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def prune(work: Path, keep: int) -> int:
    """Delete all but the newest `keep` complete old-style checkpoints and weight versions; the bytes freed."""
    freed = 0
    for pattern in ("old/step-*", "weights/v*"):
        for folder in sorted(work.glob(pattern))[:-keep]:
            freed += folder_bytes(folder)
            shutil.rmtree(folder, ignore_errors=True)
    return freed


def ensure_model(name: str) -> Path:
    from streamrl.runtime.model_init import init_model

    folder = OUT / "models" / name
    if not (folder / "config.json").exists():
        print(f"building {name} (model init) in {folder}", flush=True)
        init_model(name, folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models",
        default="qwen2-0.5b:full,qwen2-1.5b:lora",
        help="ARCHITECTURE:full|lora|adapter, comma-separated (adapter: LoRA with adapter versions)",
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-freq", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES) + ",sync3", help="which of off, before, after, sync3 to run")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "KIND", "MODE", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, kind, mode, work = args.child
        print(json.dumps(child(model, kind, mode, args.steps, args.save_freq, Path(work))))
        return
    results = []
    for spec in args.models.split(","):
        name, kind = spec.split(":")
        model = ensure_model(name)
        for mode in args.modes.split(","):
            work = OUT / "checkpoint_cost" / f"{name}-{kind}-{mode}"
            shutil.rmtree(work, ignore_errors=True)
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--steps",
                    str(args.steps),
                    "--save-freq",
                    str(args.save_freq),
                    "--child",
                    str(model),
                    kind,
                    mode,
                    str(work),
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise SystemExit(f"{name} {kind} {mode} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            shutil.rmtree(work, ignore_errors=True)
            row = results[-1]
            print(
                f"{name:12} {kind:5} {mode:7} step {row['step_s']:6.2f} s  waits {row['wait_s']:6.2f} s  "
                f"writes {row['bytes_per_step'] / 1e9:6.2f} GB/step  peak RSS {row['peak_rss_gb']:5.1f} GB",
                flush=True,
            )
    (OUT / "checkpoint_cost.json").write_text(json.dumps(results, indent=1))
    print(f"\nsteps: {args.steps}, snapshot every {args.save_freq} (after); a weight version every step in both")
    for name_kind in dict.fromkeys((r["model"], r["kind"]) for r in results):
        rows = {r["mode"]: r for r in results if (r["model"], r["kind"]) == name_kind}
        if not set(MODES) <= set(rows):
            continue
        before, after = rows["before"], rows["after"]
        print(
            f"{name_kind[0]} ({name_kind[1]}, {before['parameters'] / 1e9:.2f}B parameters): the step waits "
            f"{before['wait_s']:.2f} s before, {after['wait_s']:.2f} s after "
            f"({before['wait_s'] / max(after['wait_s'], 1e-9):.1f}x less); writes "
            f"{before['bytes_per_step'] / 1e9:.2f} -> {after['bytes_per_step'] / 1e9:.2f} GB a step; peak RSS "
            f"{rows['off']['peak_rss_gb']:.1f} (off) / {before['peak_rss_gb']:.1f} / {after['peak_rss_gb']:.1f} GB"
        )
        if "sync3" in rows:
            print(
                f"  with a version every {args.save_freq} steps: waits {rows['sync3']['wait_s']:.2f} s, writes "
                f"{rows['sync3']['bytes_per_step'] / 1e9:.2f} GB a step, peak RSS {rows['sync3']['peak_rss_gb']:.1f} GB"
            )


if __name__ == "__main__":
    main()
