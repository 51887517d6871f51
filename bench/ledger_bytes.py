"""What the ledger costs when every token of every rollout is kept: bytes per rollout as
stored, by table, under PostgreSQL's two TOAST compressions for the packed token columns,
and the projection per day at a cluster's rollout rate.

Rollouts of real sizes, written by the sink's own code (consumers/ledger_writes.py): a
prompt of 512-4,096 tokens, a response drawn from a long-tailed (log-normal) distribution
of mean ~2,000 tokens capped at 16,384, ids from a 151,936-token vocabulary (Qwen's),
logprobs as a sampler's (mostly near 0), per-token weight versions; each trajectory with
its evaluation and its sample (which carries the tokens again, as the learner reads it).
The baseline in the same run is the raw size of the events' packed arrays, and the rows
without ", once" (the sink storing a sample's arrays as well as its trajectory's).
"write (ms)" is the sink's inserts and commits per rollout.

    python bench/ledger_bytes.py [--rollouts 1000] [--rate 50]

`--rate` is rollouts per second for the projection (default 50). A cluster's own rate
is its inference GPUs x each one's decode tokens/s / the mean response's tokens; the
bytes per day scale with it linearly.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from common import bench_settings, drop_database, fresh_database

from streamrl.consumers.ledger_writes import Placed, create_staging_tables, insert_events
from streamrl.consumers.sample_arrays import TrajectoryArrays
from streamrl.runtime.db import connect
from streamrl.schema.events import Evaluation, Sample, Trajectory, pack_float32, pack_int32, pack_mask
from streamrl.schema.ledger import SAMPLE_ARRAYS

VOCAB = 151_936
PACKED = {
    "trajectories": ("tokens", "loss_mask", "logprobs", "token_versions"),
    "samples": ("tokens", "loss_mask", "logprobs", "token_versions", "token_advantages"),
}
TABLES = ("trajectories", "evaluations", "samples")


def rollout(run_id: str, index: int, rng: np.random.Generator) -> tuple[Trajectory, Evaluation, Sample]:
    prompt = int(rng.integers(512, 4097))
    response = int(min(16_384, max(1, rng.lognormal(np.log(1400), 0.85))))
    total = prompt + response
    tokens = pack_int32(rng.integers(0, VOCAB, total))
    mask = np.zeros(total, np.uint8)
    mask[prompt:] = 1
    logprobs = np.zeros(total, np.float32)
    logprobs[prompt:] = -np.abs(rng.exponential(0.3, response)).astype(np.float32)
    version = index // 512
    versions = np.full(total, version, np.int32)
    versions[prompt + response // 2 :] += int(rng.random() < 0.2)  # a fifth span a weight update
    group, trajectory_id = f"g{index // 8}", f"traj-{index}"
    trajectory = Trajectory(
        run_id=run_id,
        trajectory_id=trajectory_id,
        task_id=f"t{index}",
        group_id=group,
        sample_index=index % 8,
        weight_version=version,
        tokens=tokens,
        loss_mask=pack_mask(mask),
        logprobs=pack_float32(logprobs),
        token_versions=pack_int32(versions),
        prompt_length=prompt,
        finish_reason="stop" if response < 16_384 else "length",
        timings={"generate_s": response / 1600},
        worker_id="bench",
        step=version,
    )
    evaluation = Evaluation(
        run_id=run_id, trajectory_id=trajectory_id, task_id=f"t{index}", group_id=group, reward=float(index % 2), step=version
    )
    sample = Sample(
        run_id=run_id,
        trajectory_id=trajectory_id,
        group_id=group,
        advantage=0.5,
        reward=float(index % 2),
        group_reward_mean=0.5,
        group_reward_std=0.5,
        group_size=8,
        weight_version=version,
        step=version,
        tokens=tokens,
        loss_mask=pack_mask(mask),
        logprobs=pack_float32(logprobs),
        token_versions=pack_int32(versions),
    )
    return trajectory, evaluation, sample


def stored_bytes_sql() -> str:
    """A table's bytes with its indexes and TOAST: a table partitioned by run (migration
    0019) holds none itself, its runs' tables do."""
    return (
        "select sum(pg_total_relation_size(oid)) from "
        "(select %(table)s::regclass as oid union select relid from pg_partition_tree(%(table)s::regclass)) tree"
    )


def measure(settings, compression: str, count: int, seed: int, once: bool) -> tuple[dict[str, float], float, float, float]:
    """(stored bytes per rollout by table, raw packed bytes per rollout, tokens per rollout,
    seconds of writing per rollout: the sink's inserts and their commits). Each batch's
    samples are written after its trajectories, as the sink reads them (the processor
    makes a sample from a trajectory it has read); `once`: the sink keeps a sample's
    arrays only in its trajectory's row (consumers/sample_arrays.py)."""
    fresh = fresh_database(settings, f"streamrl_ledger_bytes_{compression}")
    try:
        with connect(fresh.database_url, autocommit=True) as conn:
            for table, columns in PACKED.items():
                for column in columns:
                    conn.execute(f"alter table {table} alter column {column} set compression {compression}")
            create_staging_tables(conn)
            arrays = TrajectoryArrays() if once else None
            rng, raw, tokens, offset, writing = np.random.default_rng(seed), 0, 0, 0, 0.0
            for start in range(0, count, 100):
                rollouts, samples = [], []
                for index in range(start, min(count, start + 100)):
                    trajectory, evaluation, sample = rollout("bytes", index, rng)
                    rollouts += [Placed(trajectory, "bench", 0, offset), Placed(evaluation, "bench", 0, offset + 1)]
                    samples.append(Placed(sample, "bench", 0, offset + 2))
                    offset += 3
                    raw += 2 * sum(len(getattr(sample, name)) for name in SAMPLE_ARRAYS)
                    tokens += len(sample.tokens) // 4
                started = time.perf_counter()
                for batch in (rollouts, samples):
                    written: dict = {}
                    with conn.transaction():
                        insert_events(conn, batch, arrays, written)
                    if arrays is not None:
                        arrays.remember(written)
                writing += time.perf_counter() - started
            conn.execute("vacuum analyze")
            stored = {table: int(conn.execute(stored_bytes_sql(), {"table": table}).fetchone()[0]) / count for table in TABLES}
        return stored, raw / count, tokens / count, writing / count
    finally:
        drop_database(settings, fresh)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="rollouts per second for the projection")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = bench_settings()
    with connect(settings.database_url, autocommit=True) as conn:
        version = conn.execute("show server_version").fetchone()[0]
    print(f"PostgreSQL {version}; {args.rollouts:,} rollouts; projection at {args.rate:g} rollouts/s", flush=True)
    print(
        f"{'compression':<12}{'tokens/rollout':>16}{'raw arrays (KB)':>17}"
        + "".join(f"{t + ' (KB)':>20}" for t in TABLES)
        + f"{'total (KB)':>12}{'ratio':>8}{'TB/day':>9}{'write (ms)':>12}"
    )
    for compression, once in (("pglz", False), ("lz4", False), ("pglz", True), ("lz4", True)):
        started = time.perf_counter()
        label = f"{compression}{', once' if once else ''}"
        try:
            stored, raw, tokens, writing = measure(settings, compression, args.rollouts, args.seed, once)
        except Exception as exc:  # a server built without lz4 says so
            print(f"{label:<12}not measured: {str(exc).splitlines()[0]}")
            continue
        total = sum(stored.values())
        per_day = total * args.rate * 86_400 / 1e12
        print(
            f"{label:<12}{tokens:>16,.0f}{raw / 1024:>17,.1f}"
            + "".join(f"{stored[t] / 1024:>20,.1f}" for t in TABLES)
            + f"{total / 1024:>12,.1f}{total / raw:>8.2f}{per_day:>9.2f}{writing * 1000:>12.2f}"
            + f"   ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
