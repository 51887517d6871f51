"""Run under torchrun (or alone): the learner's model side (learner/policy.py) trains
fixed steps on fixed samples, writes its weight version and checkpoint, and saves its
parameters for the test to compare. `resume` continues from the checkpoint.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/helpers/dist_learner.py MODEL WORK train
"""

import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from streamrl.learner.batching import TrainItem
from streamrl.learner.policy import Policy
from streamrl.learner.trainers import GRPOTrainer
from streamrl.runtime.config import Recipe


def step_items(step: int) -> list[TrainItem]:
    rng = np.random.default_rng(step)
    items = []
    for i in range(5):  # odd on purpose: shares of unequal size
        n = int(rng.integers(6, 14))
        tokens = rng.integers(4, 60, n).astype(np.int32)
        mask = np.array([0] * 3 + [1] * (n - 3), dtype=np.uint8)
        behaviour = np.log(rng.uniform(0.2, 0.9, n)).astype(np.float32) * mask
        items.append(
            TrainItem(
                tokens=tokens,
                mask=mask,
                behaviour_logprobs=behaviour,
                advantage=float(rng.normal()),
                trajectory_id=f"s{step}-{i}",
                group_id=f"g{step}",
            )
        )
    return items


def main(model: str, work: str, mode: str) -> None:
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    rows = '{"prompt": "12+34=", "answer": "6"}\n{"prompt": "5+5=", "answer": "0"}\n{"prompt": "7+1=", "answer": "8"}\n'
    (work / "val.jsonl").write_text(rows)
    recipe = Recipe.from_dict(
        {
            "rollout_worker": {"model_path": model, "temperature": 1.0, "max_response_length": 4},
            "data": {"data_files": [str(work / "val.jsonl")]},
            "validate": {"data": {"data_files": [str(work / "val.jsonl")]}},
            "trainer": {
                "lr": 1e-3,
                "micro_batch_tokens": 24,
                "warmup_cross_entropy_steps": 3,
                "warmup_batch_size": 4,
                "device": os.environ.get("STREAMRL_TEST_DEVICE", "cpu"),
                "dtype": os.environ.get("STREAMRL_TEST_DTYPE", "float32"),
                # STREAMRL_TEST_LORA=RANK: a LoRA adapter of that rank trains
                "lora": {"rank": int(os.environ["STREAMRL_TEST_LORA"]), "alpha": 8.0}
                if os.environ.get("STREAMRL_TEST_LORA")
                else None,
            },
        }
    )
    policy = Policy(recipe, GRPOTrainer, work / "checkpoints")
    steps = [1, 2, 3] if mode == "train" else [4]
    if policy.is_main:
        if mode == "train":
            # The learner's start: held-out generation, then a cross-entropy warm-up with
            # its own optimizer (sharded forwards without a backward must leave the
            # model's parameters the sharded ones).
            assert policy.call("warm_up")["warmup_steps"] == 3
        else:  # the snapshot's weights, as this many ranks loaded them
            save_params(policy.call("write_version", work / "loaded", 3), work / "params-loaded.pt")
        for step in steps:
            result = policy.call("train", 1e-3, items=step_items(step))
            assert result.skipped is None, result.skipped
        folder = policy.call("write_version", work / "weights", steps[-1])
        policy.call("write_checkpoint", steps[-1], {"offsets": {}}, 0)  # sharded, in the background
        policy.call("finish_checkpoint", True)
        policy.stop_followers()
        save_params(folder, work / f"params-{mode}.pt")
    else:
        policy.follow()
    policy.close()


def save_params(folder: Path, path: Path) -> None:
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(folder)
    torch.save({k: v.clone() for k, v in saved.state_dict().items()}, path)


if __name__ == "__main__":
    main(*sys.argv[1:4])
