"""The run browser's page times on a ledger of 1M trajectories, beside the same pages of
a run of 1,000 in the same database (the baseline: what a page costs when the ledger is
small).

A fresh database on the bench server gets two synthetic runs (trajectories, their
evaluations and samples, one train step per 256 trajectories), written with COPY; then
`streamrl ui` serves it and each page is fetched over HTTP, median of 5.

    python bench/ui_pages.py [--trajectories 1000000]
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime

import numpy as np
from common import bench_settings, drop_database, fresh_database
from psycopg.types.json import Jsonb

from streamrl.runtime.db import connect

PER_STEP = 256
GROUP = 8
TOKENS = 64
TOKEN = secrets.token_urlsafe(16)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


PORT = free_port()


def fill(url: str, run_id: str, count: int) -> None:
    """`count` trajectories of TOKENS tokens (16 prompt, 48 trained), with evaluations and
    samples, and their train steps."""
    now = datetime.now(UTC)
    tokens = np.arange(TOKENS, dtype="<i4").tobytes()
    mask = np.r_[np.zeros(16), np.ones(TOKENS - 16)].astype(np.uint8).tobytes()
    logprobs = np.full(TOKENS, -0.5, dtype="<f4").tobytes()
    rng = np.random.default_rng(0)
    rewards = rng.random(count)
    common = "event_id, run_id, schema_version, created_at"
    with connect(url, autocommit=True) as conn:
        conn.execute(
            "insert into runs (run_id, name, status, config) values (%s, %s, 'finished', %s)",
            (run_id, run_id, Jsonb({"experiment_name": run_id, "rollout_worker": {"model_path": "/nonexistent"}})),
        )
        with conn.cursor() as cur:
            with cur.copy(
                f"copy trajectories ({common}, trajectory_id, task_id, group_id, sample_index, group_size, "
                "weight_version, tokens, loss_mask, logprobs, num_tokens, num_trained_tokens, prompt_length, "
                "prompt_text, response_text, is_val, step) from stdin"
            ) as copy:
                for i in range(count):
                    step, group = i // PER_STEP + 1, i // GROUP
                    tid = f"s{step:06d}-g{group:07d}-{i % GROUP}"
                    copy.write_row(
                        (
                            f"t-{run_id}-{i}",
                            run_id,
                            1,
                            now,
                            tid,
                            tid,
                            f"s{step:06d}-g{group:07d}",
                            i % GROUP,
                            GROUP,
                            step - 1,
                            tokens,
                            mask,
                            logprobs,
                            TOKENS,
                            TOKENS - 16,
                            16,
                            "12+44=",
                            "56",
                            False,
                            step,
                        )
                    )
            with cur.copy(f"copy evaluations ({common}, trajectory_id, group_id, reward, is_val, step) from stdin") as copy:
                for i in range(count):
                    step, group = i // PER_STEP + 1, i // GROUP
                    copy.write_row(
                        (
                            f"e-{run_id}-{i}",
                            run_id,
                            1,
                            now,
                            f"s{step:06d}-g{group:07d}-{i % GROUP}",
                            f"s{step:06d}-g{group:07d}",
                            float(rewards[i]),
                            False,
                            step,
                        )
                    )
            with cur.copy(
                f"copy samples ({common}, trajectory_id, group_id, advantage, reward, group_reward_mean, "
                "group_reward_std, group_size, estimator, weight_version, step, tokens, loss_mask, logprobs, "
                "num_tokens) from stdin"
            ) as copy:
                for i in range(count):
                    step, group = i // PER_STEP + 1, i // GROUP
                    copy.write_row(
                        (
                            f"p-{run_id}-{i}",
                            run_id,
                            1,
                            now,
                            f"s{step:06d}-g{group:07d}-{i % GROUP}",
                            f"s{step:06d}-g{group:07d}",
                            float(rewards[i] - 0.5),
                            float(rewards[i]),
                            0.5,
                            0.29,
                            GROUP,
                            "grpo",
                            step - 1,
                            step,
                            tokens,
                            mask,
                            logprobs,
                            TOKENS,
                        )
                    )
            steps = (count + PER_STEP - 1) // PER_STEP
            with cur.copy(
                f"copy train_steps ({common}, step, weight_version, loss, clip_fraction, grad_norm, lr, tokens, "
                "samples, seconds, metrics, staleness) from stdin"
            ) as copy:
                for step in range(1, steps + 1):
                    copy.write_row(
                        (
                            f"ts-{run_id}-{step}",
                            run_id,
                            1,
                            now,
                            step,
                            step,
                            1.0 / step,
                            0.0,
                            1.0,
                            1e-4,
                            PER_STEP * 48,
                            PER_STEP,
                            0.5,
                            Jsonb({"reward_mean": 0.5, "logprob_gap_mean": 0.01}),
                            Jsonb({"mean": 0.5}),
                        )
                    )
        conn.execute("analyze")


def fetch_ms(path: str) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            reply.read()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def pages(run_id: str, count: int) -> dict[str, str]:
    last_step = (count - 1) // PER_STEP + 1
    i = count // 2  # a trajectory half-way through the run: its step and group
    middle = f"s{i // PER_STEP + 1:06d}-g{i // GROUP:07d}"
    return {
        "runs list": "/",
        "run page (curves)": f"/runs/{run_id}",
        "rollouts, first page": f"/runs/{run_id}/rollouts",
        "rollouts, a step": f"/runs/{run_id}/rollouts?step={last_step // 2}",
        "rollouts, a group": f"/runs/{run_id}/rollouts?group={middle}",
        "rollouts, a page deep in the run": f"/runs/{run_id}/rollouts?after={count - 100}",
        "rollouts, SQL filter (e.reward > 0.99)": f"/runs/{run_id}/rollouts?where=e.reward%20%3E%200.99",
        "one trajectory": f"/runs/{run_id}/rollouts/{middle}-0",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trajectories", type=int, default=1_000_000)
    args = parser.parse_args()
    settings = bench_settings()
    fresh = fresh_database(settings, "streamrl_ui_bench")
    try:
        started = time.perf_counter()
        fill(fresh.database_url, "small", 1000)
        fill(fresh.database_url, "large", args.trajectories)
        print(
            f"wrote 1,000 + {args.trajectories:,} trajectories (with evaluations and samples) in "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        env = {**os.environ, "STREAMRL_DATABASE_URL": fresh.database_url, "STREAMRL_UI_TOKEN": TOKEN}
        server = subprocess.Popen(
            [sys.executable, "-m", "streamrl.cli", "ui", "--port", str(PORT)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            for _ in range(120):
                try:
                    fetch_ms("/")
                    break
                except OSError:
                    time.sleep(0.5)
            small, large = pages("small", 1000), pages("large", args.trajectories)
            print(f"{'page':<42}{'1k run (ms)':>12}{f'{args.trajectories:,} run (ms)':>20}{'ratio':>8}")
            for name in small:
                a, b = fetch_ms(small[name]), fetch_ms(large[name])
                print(f"{name:<42}{a:>12.1f}{b:>20.1f}{b / a:>8.2f}", flush=True)
        finally:
            server.terminate()
            server.wait(30)
    finally:
        drop_database(settings, fresh)


if __name__ == "__main__":
    main()
