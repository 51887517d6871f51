"""The cluster twin: StreamRL's real event path and ledger, driven by modelled GPUs.

`streamrl run` runs as it does on a cluster (publisher, broker, workers, stream
processor, ledger sink, PostgreSQL, learner loop); only the model's compute is replaced
by the time it would take (runtime/gpu_model.py): the workers' inference backend is
`modelled` (producers/modelled_engine.py: continuous batching, long-tailed answers,
weight-sync pauses, real-sized token, logprob and version arrays) and the learner's
policy waits out a modelled training step (learner/modelled_policy.py). The bench sets
them through STREAMRL_CLUSTER_TWIN; no recipe can.

It prints, for each schedule (sync, batch-async, fully-async) and cluster size:
sustained rollouts/s against the ideal schedule's, MB/s through Kafka and into the
ledger, CPU per rollout of each process, the inference GPUs' and the learner's busy
fractions, what the learner waited for and whether the GPUs were short of requests
(bench/schedule_gaps.py), the staleness of what was trained, and trajectory -> sample ->
trained latencies. Plots go to bench/out/cluster_twin/.

    python bench/cluster_twin.py [--quick] [--gpus 8] [--deep 4] [--scaling 8,64,512] [--lengths 500,4000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import psutil
import yaml
from common import OUT, bench_settings, fresh_run_id
from kafka import KafkaConsumer, TopicPartition
from process_cpu import CpuMeter
from rich.console import Console
from rich.table import Table
from schedule_gaps import schedule_gaps

from streamrl.runtime.db import connect
from streamrl.runtime.folders import run_logs
from streamrl.runtime.gpu_model import TWIN_ENV, TwinModel, ideal_rollouts_per_s
from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_retention import delete_run_topics
from streamrl.schema.topics import topic_name

ROOT = Path(__file__).resolve().parent.parent
HERE = OUT / "cluster_twin"
GROUP = 8  # rollouts a prompt (rollout_repeat_n)
EVENT_PATH = ("publish", "broker", "processor", "sink", "postgresql")
console = Console(width=None if sys.stdout.isatty() else 160)  # a log keeps the tables whole


@dataclasses.dataclass
class Case:
    schedule: str
    model: TwinModel
    steps: int
    groups_per_step: int
    window_s: float = math.inf  # measure at most this long, then stop the run
    window_steps: int = 0  # or until this many steps trained after the first (0: until the last but one)
    in_flight: float = 1.0  # the worker's max_concurrent_tasks, in multiples of the GPUs' room
    staleness: int = 1  # weight.staleness_threshold of the async schedules
    workers: int = 1  # worker processes, the GPUs split between them
    batch_groups: str = "published"  # trajectory_pool.batch_groups

    @property
    def label(self) -> str:
        staleness = f" (staleness {self.staleness})" if self.schedule != "sync" else ""
        staleness += f", {self.workers} workers" if self.workers > 1 else ""
        staleness += ", first complete groups" if self.batch_groups == "first_complete" else ""
        h100s = self.model.inference_gpus * self.model.time_scale  # whose stream it carries
        return (
            f"{self.schedule}{staleness}, {self.model.inference_gpus} GPUs x {self.model.time_scale:g} "
            f"= {h100s:g} H100s, median answer {self.model.response_median}"
        )


def tokenizer_model() -> Path:
    """The built-in recipe's model folder: the twin uses its tokenizer only."""
    folder = ROOT / "recipes" / "arith" / "generated" / "last_digit" / "model"
    if not folder.is_dir():
        subprocess.run([sys.executable, str(ROOT / "recipes" / "arith" / "setup.py")], check=True, cwd=ROOT)
    return folder


def write_data(case: Case, folder: Path) -> Path:
    """Prompts of the modelled lengths (the character tokenizer: a character a token)."""
    rng = random.Random(case.model.seed)
    low, high = case.model.prompt_tokens
    path = folder / "train.jsonl"
    with path.open("w") as out:
        for _ in range(case.steps * case.groups_per_step + case.groups_per_step):
            length = rng.randint(low, high)
            out.write(json.dumps({"prompt": "".join(rng.choices("0123456789", k=length)), "answer": "0"}) + "\n")
    return path


def write_recipe(case: Case, folder: Path, model_dir: Path) -> Path:
    running = int(case.model.inference_gpus // case.workers * case.model.max_running * case.in_flight)
    recipe = {
        "project_name": "streamrl",
        "experiment_name": "cluster-twin",
        "data": {
            "type": "jsonl",
            "data_files": [str(write_data(case, folder))],
            "prompt_key": "prompt",
            "answer_key": "answer",
            "apply_chat_template": False,
            "shuffle": False,
            "max_prompt_length": case.model.prompt_tokens[1],
        },
        "rollout_worker": {
            "type": "single_turn",
            "model_path": str(model_dir),
            "evaluator_module_path": f"{ROOT / 'bench' / 'twin' / 'evaluator.py'}:TwinEvaluator",
            "max_prompt_length": case.model.prompt_tokens[1],
            "max_response_length": case.model.response_max,
            "rollout_repeat_n": GROUP,
            "num_workers": case.workers,
            "max_concurrent_tasks": running,
        },
        "trajectory_pool": {"batch_size": case.groups_per_step, "group_timeout_s": 3600, "batch_groups": case.batch_groups},
        "algorithm": {"type": "grpo"},
        "trainer": {"type": "grpo", "total_train_steps": case.steps, "save_freq": case.steps, "warmup_cross_entropy_steps": 0},
        # sync trains on the newest version only: its recipe leaves the staleness bound alone
        "weight": {"sync_mode": case.schedule} | ({} if case.schedule == "sync" else {"staleness_threshold": case.staleness}),
        "validate": {"validate_before_train": False, "eval": {"compute_interval": 10_000}},
        "service": {
            "inference_service": {"backend": "embedded", "max_batch_size": running},
            "broker": {"retention": "keep"},  # read by topic_rates, then removed
        },
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def query(settings: Settings, sql: str, *params) -> list[tuple]:
    with connect(settings.database_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def step_times(settings: Settings, run_id: str) -> dict[int, float]:
    rows = query(settings, "select step, extract(epoch from created_at) from train_steps where run_id = %s", run_id)
    return {step: float(at) for step, at in rows}


def run_case(settings: Settings, case: Case, model_dir: Path, out: Path) -> dict:
    run_id = fresh_run_id(f"twin-{case.schedule}-{case.model.inference_gpus}")
    folder = out / run_id
    folder.mkdir(parents=True, exist_ok=True)
    recipe = write_recipe(case, folder, model_dir)
    each = dataclasses.replace(case.model, inference_gpus=case.model.inference_gpus // case.workers)  # a worker's GPUs
    env = {**os.environ, TWIN_ENV: each.to_env()}
    run = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "run", str(recipe), "--run", run_id, "--out", str(folder / "out")],
        cwd=ROOT,
        env=env,
        stdout=(folder / "run.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    # the window: from the first trained step until the last but one (the processes still
    # running), or `window_s` later, when the run is stopped (SIGTERM: it stops as on Ctrl-C)
    last = 1 + case.window_steps if case.window_steps else case.steps - 1
    marks: list[tuple[float, dict[str, float]]] = []
    meter = CpuMeter(run_id)
    started = time.time()
    with console.status(f"{case.label}: starting") as status:
        while run.poll() is None:
            cpu = meter.read()  # at every poll: the learner may end its last step before the sink records the one before
            done = len(step_times(settings, run_id))
            status.update(f"{case.label}: step {done}/{case.steps} after {time.time() - started:.0f} s")
            if not marks and done >= 1:
                marks.append((time.time(), cpu))
            elif marks and (done >= last or time.time() - marks[0][0] >= case.window_s):
                marks.append((time.time(), cpu))
                break
            time.sleep(0.2)
        stopped = run.poll() is None and (case.window_steps > 0 or done < last)  # else it ends by itself
        if stopped:
            run.terminate()
        run.wait()
    if len(marks) < 2 or (run.returncode != 0 and not stopped):
        sys.exit(f"{case.label}: the run failed (exit {run.returncode}); see {folder / 'run.log'}")
    try:
        return measure(settings, case, run_id, marks[0], marks[1])
    finally:
        delete_run_topics(settings, run_id)  # the embedded broker holds them in memory


def measure(settings, case: Case, run_id: str, mark0, mark1) -> dict:
    t0, t1 = mark0[0], mark1[0]
    wall = t1 - t0
    trained = query(
        settings,
        """select count(*), coalesce(sum(s.num_tokens), 0) from samples s join train_steps t using (run_id, step)
           where s.run_id = %s and t.created_at > to_timestamp(%s) and t.created_at <= to_timestamp(%s)""",
        run_id,
        t0,
        t1,
    )[0]
    generated = query(
        settings,
        """select count(*), avg(pg_column_size(t.*)) from trajectories t
           where run_id = %s and created_at > to_timestamp(%s) and created_at <= to_timestamp(%s)""",
        run_id,
        t0,
        t1,
    )[0]
    # the whole run, fill and drain included: what a user waiting for N steps sees
    first_task, last_step, all_trained = query(
        settings,
        """select (select extract(epoch from min(created_at)) from tasks where run_id = %s),
                  (select extract(epoch from max(created_at)) from train_steps where run_id = %s),
                  (select count(*) from samples s join train_steps t using (run_id, step) where s.run_id = %s)""",
        run_id,
        run_id,
        run_id,
    )[0]
    sample_bytes = query(settings, "select avg(pg_column_size(s.*)) from samples s where run_id = %s", run_id)[0][0] or 0
    cpu = {role: mark1[1].get(role, 0.0) - mark0[1].get(role, 0.0) for role in mark1[1]}
    cpu_wall = wall
    rollouts = max(generated[0], 1)
    ideal = ideal_rollouts_per_s(case.model, GROUP, case.groups_per_step * GROUP)
    per_s = trained[0] / wall
    staleness = query(
        settings,
        """select s.step - 1 - s.weight_version, count(*) from samples s join train_steps t using (run_id, step)
           where s.run_id = %s and t.created_at > to_timestamp(%s) and t.created_at <= to_timestamp(%s) group by 1""",
        run_id,
        t0,
        t1,
    )
    latency = query(
        settings,
        """select percentile_cont(array[0.5, 0.9, 0.99]) within group (order by extract(epoch from s.created_at - t.created_at)),
                  percentile_cont(array[0.5, 0.9, 0.99]) within group (order by extract(epoch from st.created_at - s.created_at))
           from samples s join trajectories t on t.run_id = s.run_id and t.trajectory_id = s.trajectory_id
           join train_steps st on st.run_id = s.run_id and st.step = s.step
           where s.run_id = %s and st.created_at > to_timestamp(%s) and st.created_at <= to_timestamp(%s)""",
        run_id,
        t0,
        t1,
    )[0]
    busy, mean_batch, unasked = gpu_busy(settings, run_id, t0, t1, case.model.max_running)
    k = 0 if case.schedule == "sync" else case.staleness
    slots = case.model.inference_gpus * case.model.max_running
    gaps = schedule_gaps(partial(query, settings), run_logs(settings.home, run_id), run_id, t0, t1, k, slots)
    return {
        "label": case.label,
        "staleness_bound": case.staleness,
        "batch_groups": case.batch_groups,
        "schedule": case.schedule,
        "model": dataclasses.asdict(case.model),
        "rollouts_per_step": case.groups_per_step * GROUP,
        "window_s": wall,
        "trained_per_s": per_s,
        "whole_run_per_s": all_trained / (float(last_step) - float(first_task)),
        "generated_per_s": generated[0] / wall,
        "ideal": ideal,
        "trained_tokens_per_s": trained[1] / wall,
        "ledger_bytes_per_rollout": float(generated[1] or 0) + float(sample_bytes),
        "kafka_mb_per_s": topic_rates(settings, run_id, t0, t1),
        "cpu_us_per_rollout": {role: seconds / rollouts * 1e6 for role, seconds in cpu.items()},
        "cores_busy": {role: seconds / cpu_wall for role, seconds in cpu.items()},
        "gpu_busy": busy,
        "mean_batch": mean_batch,
        "unasked_slots": unasked,
        "learner_busy": learner_busy(settings, run_id, t0, t1),
        "gaps": gaps,
        "staleness": {int(k): int(v) for k, v in staleness},
        "latency_s": {"trajectory_to_sample": list(latency[0] or []), "sample_to_trained": list(latency[1] or [])},
    }


def gpu_busy(settings: Settings, run_id: str, t0: float, t1: float, max_running: int) -> tuple[float, float, float]:
    """The inference GPUs in the window, from the engines' running totals: busy
    GPU-seconds over GPU-seconds, the mean number of sequences a decoding GPU ran, and the
    share of decoding slot-seconds left free while no request waited."""
    busy, decoding, running, unasked, gpus = 0.0, 0.0, 0.0, 0.0, 0
    for path in run_logs(settings.home, run_id).glob("engine-twin-*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        at = np.array([line["time"] for line in lines])

        def between(key: str, lines=lines, at=at) -> float:
            total = np.array([line[key] for line in lines])
            return float(np.interp(t1, at, total) - np.interp(t0, at, total))

        busy += between("decoding_s") + between("prefill_s")
        decoding += between("decoding_s")
        running += between("running_s")
        unasked += between("unasked_slot_s")
        gpus += lines[-1]["gpus"]
    if not gpus:
        return math.nan, math.nan, math.nan
    slot_s = decoding * max_running
    return busy / (gpus * (t1 - t0)), running / decoding if decoding else 0.0, unasked / slot_s if slot_s else 0.0


def learner_busy(settings: Settings, run_id: str, t0: float, t1: float) -> float:
    path = run_logs(settings.home, run_id) / "learner-twin.jsonl"
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    busy = sum(max(0.0, min(s["time"] + s["seconds"], t1) - max(s["time"], t0)) for s in steps)
    return busy / (t1 - t0)


def topic_rates(settings: Settings, run_id: str, t0: float, t1: float) -> dict[str, float]:
    """MB/s of record values on the run's topics between t0 and t1 (broker timestamps)."""
    rates = {}
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, fetch_max_bytes=64 << 20)
    try:
        consumer.topics()  # the cluster's metadata, which partitions_for_topic reads
        for kind in ("tasks", "trajectories", "evaluations", "samples", "steps", "weights"):
            topic = topic_name(run_id, kind)
            partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            if not partitions:
                continue
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            ends = consumer.end_offsets(partitions)
            total = 0
            while any(consumer.position(tp) < ends[tp] for tp in partitions):
                for records in consumer.poll(timeout_ms=1000).values():
                    total += sum(len(r.value or b"") for r in records if t0 * 1000 < r.timestamp <= t1 * 1000)
            rates[kind] = total / (t1 - t0) / 1e6
    finally:
        consumer.close()
    return rates


def show(results: list[dict], title: str) -> None:
    """One column a case, one row a measure (a table that fits a terminal)."""
    table = Table(title=title)
    table.add_column("")
    for r in results:
        table.add_column(r["label"].replace(", ", "\n"), justify="right")

    def row(name: str, cell) -> None:
        table.add_row(name, *[cell(r) for r in results])

    def ideal(r: dict) -> float:
        return r["ideal"]["sync"] if r["schedule"] == "sync" else r["ideal"]["async"]

    def stale(r: dict) -> str:
        counts = r["staleness"]
        total = sum(counts.values()) or 1
        shares = [counts.get(0, 0), counts.get(1, 0), sum(v for k, v in counts.items() if k >= 2)]
        return "/".join(f"{s / total:.0%}" for s in shares)

    row("window (s)", lambda r: f"{r['window_s']:.0f}")
    row("trained rollouts/s, whole run", lambda r: f"{r['whole_run_per_s']:.1f}")
    row("trained rollouts/s, window", lambda r: f"{r['trained_per_s']:.1f}")
    row("ideal schedule's rollouts/s", lambda r: f"{ideal(r):.1f}")
    row("  whole run, of the ideal", lambda r: f"{r['whole_run_per_s'] / ideal(r):.0%}")
    row("  window, of the ideal", lambda r: f"{r['trained_per_s'] / ideal(r):.0%}")
    row("generated rollouts/s", lambda r: f"{r['generated_per_s']:.1f}")
    row("inference GPUs busy", lambda r: f"{r['gpu_busy']:.0%}")
    row("  sequences a decoding GPU ran", lambda r: f"{r['mean_batch']:.1f} of {r['model']['max_running']}")
    row("  slots free, no request waiting", lambda r: f"{r['unasked_slots']:.0%}")
    row("learner busy", lambda r: f"{r['learner_busy']:.0%}")
    row("  idle for an overdue group", lambda r: f"{r['gaps']['learner_idle_share']['overdue group']:.0%}")
    row("  idle for other groups", lambda r: f"{r['gaps']['learner_idle_share']['other groups']:.0%}")
    row("GPUs short of tasks (time)", lambda r: f"{r['gaps']['short_of_tasks']:.0%}")
    row("staleness 0/1/2+", stale)
    for name, key in (("trajectory→sample", "trajectory_to_sample"), ("sample→trained", "sample_to_trained")):
        row(f"{name} p50/p99 (s)", lambda r, key=key: "/".join(f"{v:.2f}" for v in r["latency_s"][key][::2]))
    row("event path CPU µs/rollout", lambda r: f"{sum(r['cpu_us_per_rollout'].get(k, 0.0) for k in EVENT_PATH):.0f}")
    row("all processes' cores busy", lambda r: f"{sum(r['cores_busy'].values()):.2f}")
    row("ledger KB/rollout", lambda r: f"{r['ledger_bytes_per_rollout'] / 1024:.1f}")
    for kind in ("trajectories", "samples"):
        row(f"Kafka {kind} MB/s", lambda r, kind=kind: f"{r['kafka_mb_per_s'].get(kind, 0.0):.2f}")
    row("ledger MB/s", lambda r: f"{r['ledger_bytes_per_rollout'] * r['generated_per_s'] / 1e6:.2f}")
    console.print(table)


def show_cpu(results: list[dict]) -> None:
    roles = sorted({role for r in results for role in r["cpu_us_per_rollout"]})
    table = Table(title="CPU per rollout, µs (cores busy), by process")
    table.add_column("")
    for r in results:
        table.add_column(r["label"].replace(", ", "\n"), justify="right")
    for role in roles:
        table.add_row(
            role, *[f"{r['cpu_us_per_rollout'].get(role, 0):.0f} ({r['cores_busy'].get(role, 0):.2f})" for r in results]
        )
    console.print(table)


def short_label(r: dict) -> str:
    model = r["model"]
    schedule = {"sync": "sync", "batch-async": "batch", "fully-async": "fully"}[r["schedule"]]
    staleness = "" if r["schedule"] == "sync" else f" k={r['staleness_bound']}"
    staleness += "\nfirst complete" if r.get("batch_groups") == "first_complete" else ""
    return f"{schedule}{staleness}\n{model['inference_gpus'] * model['time_scale']:g} H100s\nmedian {model['response_median']}"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 4.6))
    labels = [short_label(r) for r in results]
    x = np.arange(len(results))
    ideal = [r["ideal"]["sync"] if r["schedule"] == "sync" else r["ideal"]["async"] for r in results]
    whole = [r["whole_run_per_s"] / i for r, i in zip(results, ideal)]
    window = [r["trained_per_s"] / i for r, i in zip(results, ideal)]
    axes[0].bar(x - 0.2, whole, 0.4, label="whole run (fill and drain included)")
    axes[0].bar(x + 0.2, window, 0.4, label="window (first step to the last but one)")
    axes[0].axhline(0.9, color="grey", linestyle="--", linewidth=1, label="target 0.9")
    axes[0].set_xticks(x, labels, fontsize=7)
    axes[0].set_ylabel("trained rollouts/s over the ideal schedule's")
    axes[0].set_ylim(0, max(1.0, *window) * 1.05)
    axes[0].legend(fontsize=8)
    axes[1].bar(x - 0.2, [r["gpu_busy"] for r in results], 0.4, label="inference GPUs busy")
    axes[1].bar(x + 0.2, [r["learner_busy"] for r in results], 0.4, label="learner busy")
    axes[1].set_xticks(x, labels, fontsize=7)
    axes[1].set_ylabel("busy fraction (the window)")
    axes[1].set_ylim(0, 1)
    axes[1].legend(fontsize=8)
    fig.suptitle("The cluster twin: modelled H100s serving an 8B model, StreamRL's real event path and ledger", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    console.print(f"plot: {path}")


def print_model(model: TwinModel) -> None:
    fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(model).items())
    console.print(f"modelled: {fields}")
    ideal = ideal_rollouts_per_s(model, GROUP, model.inference_gpus * model.max_running // GROUP * GROUP)
    console.print("ideal rollouts/s: " + ", ".join(f"{k} {v:.1f}" for k, v in ideal.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI's smoke test: 2 small GPUs, sync against the deep fully-async")
    parser.add_argument("--gpus", type=int, default=8, help="inference GPUs of the schedule comparison")
    parser.add_argument("--schedules", default="sync,batch-async,fully-async", help="compared at weight.staleness_threshold 1")
    parser.add_argument(
        "--deep",
        type=int,
        default=4,
        help="also fully-async at this staleness_threshold, the worker taking that many GPUs' room of tasks (0: not)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=20.0, help="the schedule comparison's GPUs run this many times faster"
    )
    parser.add_argument(
        "--max-running", type=int, default=32, help="sequences a GPU decodes at once; a step is one such batch of every GPU"
    )
    parser.add_argument(
        "--batch-groups",
        choices=("published", "first_complete", "both"),
        default="both",
        help="trajectory_pool.batch_groups of the deep fully-async case and the scaling points (both: the deep case "
        "each way, the scaling points first_complete)",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes sharing the GPUs (a real cluster: one a node)")
    parser.add_argument("--steps", type=int, default=6, help="training steps of each schedule (a step: one batch of every GPU)")
    parser.add_argument(
        "--scaling", default="64,512", help="deep fully-async carrying the stream of this many H100s ('' to skip)"
    )
    parser.add_argument("--lengths", default="500,4000", help="median answer lengths at 64 H100s' stream ('' to skip)")
    parser.add_argument("--out", type=Path, default=HERE, help="where the runs' files, results.json and the plot go")
    parser.add_argument(
        "--scaling-seconds", type=float, default=90.0, help="each scaling point is measured over 3 steps, or this long at most"
    )
    args = parser.parse_args()
    settings = bench_settings()
    model_dir = tokenizer_model()
    args.out.mkdir(parents=True, exist_ok=True)
    base = TwinModel(inference_gpus=args.gpus, learner_gpus=args.gpus, max_running=args.max_running, time_scale=args.time_scale)
    schedules, steps = [s for s in args.schedules.split(",") if s], args.steps
    if args.quick:
        base = dataclasses.replace(base, inference_gpus=2, learner_gpus=2, max_running=32, time_scale=20.0, response_median=400)
        schedules, steps, args.scaling, args.lengths = ["sync"], 8, "", ""
    print_model(base)
    groups = base.inference_gpus * base.max_running // GROUP
    cases = [Case(s, base, steps, groups, workers=args.workers) for s in schedules]
    orders = ["published", "first_complete"] if args.batch_groups == "both" else [args.batch_groups]
    for order in orders if args.deep else []:
        cases.append(
            Case(
                "fully-async",
                base,
                steps,
                groups,
                in_flight=args.deep,
                staleness=args.deep,
                workers=args.workers,
                batch_groups=order,
            )
        )
    compared = [run_case(settings, case, model_dir, args.out) for case in cases]
    show(compared, f"Schedules on {base.inference_gpus} modelled GPUs, time scale {base.time_scale:g}")
    show_cpu(compared)
    verdicts(compared)
    scaled = []
    deep = max(args.deep, 1)
    for gpus in [int(g) for g in args.scaling.split(",") if g]:
        scaled.append(
            scale_point(settings, base, gpus, base.response_median, deep, args.scaling_seconds, model_dir, args.out, orders[-1])
        )
    for median in [int(m) for m in args.lengths.split(",") if m]:
        scaled.append(scale_point(settings, base, 64, median, deep, args.scaling_seconds, model_dir, args.out, orders[-1]))
    if scaled:
        show(scaled, "Deep fully-async carrying the stream of N H100s (GPUs x time scale): cluster sizes, answer lengths")
        show_cpu(scaled)
    results = compared + scaled
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "cluster_twin.png")
    console.print(f"{psutil.cpu_count()} cores; results: {args.out / 'results.json'}")


def verdicts(compared: list[dict]) -> None:
    sync = next((r for r in compared if r["schedule"] == "sync"), None)
    for r in compared:
        if r["schedule"] != "fully-async":
            continue
        than_sync = f", {r['whole_run_per_s'] / sync['whole_run_per_s']:.2f}x sync (target >= 2x)" if sync else ""
        of_ideal = r["whole_run_per_s"] / r["ideal"]["async"]
        console.print(f"{r['label']}, the whole run: {of_ideal:.0%} of the ideal schedule (target >= 90%){than_sync}")


def scale_point(
    settings: Settings,
    base: TwinModel,
    h100s: int,
    median: int,
    deep: int,
    seconds: float,
    model_dir: Path,
    out: Path,
    batch_groups: str,
) -> dict:
    """The rollout stream of `h100s` H100s: the comparison's GPUs, time-scaled to that many
    (what the event path sees is the stream; a real cluster's worker processes would
    split its in-flight rollouts, which one worker holds here)."""
    model = dataclasses.replace(base, time_scale=h100s / base.inference_gpus, response_median=median)
    groups = model.inference_gpus * model.max_running // GROUP
    per_s = ideal_rollouts_per_s(model, GROUP, groups * GROUP)["async"]
    steps = max(6, math.ceil(seconds * per_s / (groups * GROUP)) + 3)
    print_model(model)
    case = Case(
        "fully-async",
        model,
        steps,
        groups,
        window_s=seconds,
        window_steps=3,
        in_flight=deep,
        staleness=deep,
        batch_groups=batch_groups,
    )
    return run_case(settings, case, model_dir, out)


if __name__ == "__main__":
    main()
