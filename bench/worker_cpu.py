"""A rollout worker's CPU per rollout beside one batched `generate` of the same prompts
in one process (the baseline; target ratio <= 1.3).

The worker is the `streamrl worker` process of the built-in recipe (warmed model, one
torch thread, as `streamrl run` starts it): it reads the tasks topic, rolls each task
out through its batching engine, evaluates, publishes a trajectory and an evaluation
and commits. It is warmed up on one group first; its CPU time (psutil) is read
before the measured tasks are published and after their last evaluation arrives. The
baseline tokenizes the same prompts and calls the same engine's `generate` in batches
of the recipe's `max_batch_size` in this process (one torch thread), with the same
sampling settings; its CPU is this process's.

    python bench/worker_cpu.py [--groups 64]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, bench_settings, fresh_run_id
from processor_cpu import cpu_seconds
from time_to_accuracy import RECIPE, bench_recipe, warmed_model

from streamrl.producers.inference import EmbeddedEngine, SamplingParams
from streamrl.producers.publisher import create_run, step_tasks
from streamrl.runtime.bus import EventPublisher, RunReader
from streamrl.runtime.dataset import read_rows
from streamrl.runtime.recipe import prepare_recipe
from streamrl.schema.events import Evaluation, Trajectory, WeightVersion

REPO = Path(__file__).resolve().parent.parent


def wait_for(reader: RunReader, kind: type, count: int, seen: dict, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(1 for e in seen.values() if isinstance(e, kind)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} events after {timeout_s} s")
        events, _ = reader.poll(timeout_ms=200)
        seen.update((event.event_id, event) for event, _, _ in events)


def worker_cpu(settings, recipe, rows: list[dict], groups: int) -> tuple[float, int]:
    """CPU seconds of the worker process for `groups` groups, and the tokens it generated."""
    run_id = fresh_run_id("worker-cpu")
    size, key = recipe.rollout_worker.rollout_repeat_n, recipe.data.prompt_key
    with EventPublisher(settings) as publisher:
        create_run(settings, run_id, recipe, publisher)
        # the version the learner announces before its first step: the model the tasks start from
        publisher.publish(WeightVersion(run_id=run_id, version=0, uri=str(recipe.rollout_worker.model_path)))
    env = {**os.environ, "STREAMRL_HOME": str(settings.home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "worker", run_id],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    reader = RunReader(settings, run_id, ["trajectories", "evaluations"], group_id=None)
    seen: dict = {}
    try:
        # bundled as `run_publisher` sends them: a group's tasks a record
        with EventPublisher(settings, bundle=True) as publisher:
            for task in step_tasks(run_id, 0, rows[:1], size, key, 0):  # warm-up
                publisher.publish(task)
        wait_for(reader, Evaluation, size, seen)
        before = cpu_seconds(process.pid)
        with EventPublisher(settings, bundle=True) as publisher:
            for task in step_tasks(run_id, 1, rows[1 : groups + 1], size, key, 0):
                publisher.publish(task)
        wait_for(reader, Evaluation, size * (groups + 1), seen)
        cpu = cpu_seconds(process.pid) - before
        tokens = sum(len(e.tokens) // 4 - e.prompt_length for e in seen.values() if isinstance(e, Trajectory) and e.step == 1)
        return cpu, tokens
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        reader.close()


def batched_generate_cpu(recipe, rows: list[dict], groups: int) -> tuple[float, int]:
    """CPU seconds of one process generating the same rollouts with `generate` in batches."""
    import torch

    torch.set_num_threads(1)
    cfg = recipe.rollout_worker
    engine = EmbeddedEngine(cfg.model_path, seed=recipe.trainer.seed)
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=cfg.temperature, top_p=cfg.top_p)
    prompts = [
        engine.tokenizer(str(row[recipe.data.prompt_key]))["input_ids"]
        for row in rows[1 : groups + 1]
        for _ in range(cfg.rollout_repeat_n)
    ]
    batch = recipe.service.inference_service.max_batch_size
    engine.generate(prompts[: cfg.rollout_repeat_n], params)  # warm-up
    before = time.process_time()
    completions = [c for i in range(0, len(prompts), batch) for c in engine.generate(prompts[i : i + batch], params)]
    return time.process_time() - before, sum(len(c.response_token_ids) for c in completions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    args = parser.parse_args()
    settings = bench_settings()
    base = prepare_recipe(RECIPE)
    model_dir = warmed_model(base, OUT / "time_to_accuracy" / "warm_model")
    recipe = prepare_recipe(bench_recipe(base, model_dir, "fully-async", 10, OUT / "worker_cpu" / "recipe.yaml"))
    rows = read_rows(recipe.data.data_files, recipe.data.type, [recipe.data.prompt_key])
    worker, worker_tokens = worker_cpu(settings, recipe, rows, args.groups)
    bare, bare_tokens = batched_generate_cpu(recipe, rows, args.groups)
    rollouts = args.groups * recipe.rollout_worker.rollout_repeat_n
    print(
        f"worker CPU per rollout, {args.groups} groups of {recipe.rollout_worker.rollout_repeat_n} "
        f"(built-in recipe, warmed model, 1 torch thread)"
    )
    print(
        f"  one batched generate, same prompts (baseline)  {bare / rollouts * 1000:7.3f} ms   "
        f"({bare_tokens / rollouts:.1f} tokens a rollout)"
    )
    print(
        f"  streamrl worker (tasks topic -> events)        {worker / rollouts * 1000:7.3f} ms   "
        f"({worker_tokens / rollouts:.1f} tokens a rollout)   ratio {worker / bare:.2f}  target <= 1.3: "
        f"{'PASS' if worker / bare <= 1.3 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
