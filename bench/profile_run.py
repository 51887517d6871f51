"""Where a run's CPU goes, by process and by kind of work: `py-spy` samples every
process of a `streamrl run` (the bench recipe of `--task`, from its warmed model) and
this sorts each process's busy samples by the code they are in.

    model       torch / transformers: sampling, forward, backward, optimizer
    kafka       kafka-python, aiokafka, faust, mode: fetch, parse, produce, coordinate
    events      schema/: encoding, decoding and ids of events
    ledger      psycopg: COPY and queries
    other       the rest: StreamRL's own loops, the evaluator, numpy
    start-up    imports, printed apart in seconds (they happen once, before the first step)

A sample counts a thread that runs or waits for a core: py-spy leaves idle threads out,
and a sample whose innermost frame waits (epoll, a lock, a queue, a sleep: WAITING) is
left out here. On a machine with fewer cores than busy threads that is more than CPU
time, so read a row as shares; `bench/step_cpu.py` gives CPU time. Printed per process
and kind, in ms per trained step (the run's shutdown included), with each kind's share
of the process, beside the step's wall-clock (py-spy slows the run a little). The
embedded broker (Rust) and PostgreSQL are not Python and are not sampled: `bench/step_cpu.py` charges them.

    python bench/profile_run.py [--task shift] [--steps 40] [--rate 50]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, bench_settings, fresh_run_id
from rich.console import Console
from rich.table import Table
from time_to_accuracy import TASKS, bench_recipe, warmed_model

from streamrl.runtime.db import connect
from streamrl.runtime.recipe import prepare_recipe

KINDS = (
    ("start-up", ("_find_and_load",)),
    ("model", ("torch/", "transformers/")),
    ("kafka", ("kafka/", "aiokafka/", "faust/", "mode/")),
    ("events", ("schema/",)),
    ("ledger", ("psycopg/",)),
)


# A thread parked in one of these is waiting, not computing: py-spy does not always see
# such a thread as idle (kafka-python's network thread in epoll, a queue's get).
WAITING = ("select (selectors.py", "wait (threading.py", "sleep", "_wait_for_tstate_lock", "get (queue.py", "poll (", "acquire")


def kind_of(frames: list[str]) -> str:
    if frames and any(leaf in frames[-1] for leaf in WAITING):
        return "waiting"
    for kind, needles in KINDS:
        if any(needle in frame for frame in frames for needle in needles):
            return kind
    return "other"


def role_of(process_frame: str) -> str:
    """'process 123:"python -m streamrl.cli worker RUN ..."' -> worker."""
    words = process_frame.split()
    if "streamrl.cli" in words:
        role = words[words.index("streamrl.cli") + 1].strip('"')
        return "orchestrator" if role == "run" else role
    return "orchestrator"


def busy_samples(raw: Path) -> dict[str, collections.Counter]:
    by_role: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        processes = [f for f in frames if f.startswith("process ")]
        by_role[role_of(processes[-1]) if processes else "orchestrator"][kind_of(frames)] += int(count)
    return by_role


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="shift", choices=sorted(TASKS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rate", type=int, default=50, help="samples a second per thread")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    settings = bench_settings()
    recipe = prepare_recipe(TASKS[args.task].recipe)
    warm = "warm_model" if args.task == "arith" else f"warm_model_{args.task}"
    model_dir = warmed_model(recipe, OUT / "time_to_accuracy" / warm)
    run_id = fresh_run_id(f"profile-{args.task}")
    folder = OUT / "profile_run"
    path = bench_recipe(recipe, model_dir, "fully-async", args.steps, folder / f"{run_id}.yaml")
    raw = folder / f"{run_id}.txt"
    subprocess.run(
        [
            spy,
            "record",
            "--subprocesses",
            "--rate",
            str(args.rate),
            "--format",
            "raw",
            "--output",
            str(raw),
            "--",
            sys.executable,
            "-m",
            "streamrl.cli",
            "run",
            str(path),
            "--run",
            run_id,
            "--out",
            str(folder / run_id),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with connect(settings.database_url, autocommit=True) as conn:
        first, last, steps = conn.execute(
            "select extract(epoch from min(created_at)), extract(epoch from max(created_at)), count(*) "
            "from train_steps where run_id = %s",
            (run_id,),
        ).fetchone()
    by_role = busy_samples(raw)
    kinds = [kind for kind, _ in KINDS] + ["other"]
    table = Table(
        title=f"active ms a trained step by process and kind, and share ({args.task}, fully-async, {steps} steps; "
        f"py-spy at {args.rate} Hz)"
    )
    stepped = [k for k in kinds if k != "start-up"]
    for column in ("process", *stepped, "all but start-up", "start-up (s, once)"):
        table.add_column(column, justify="left" if column == "process" else "right")
    per_step = 1000.0 / args.rate / steps
    for role, counts in sorted(by_role.items(), key=lambda kv: -sum(kv[1].values())):
        busy = sum(counts[k] for k in stepped) or 1
        table.add_row(
            role,
            *(f"{counts[k] * per_step:.0f} ({counts[k] / busy:.0%})" for k in stepped),
            f"{busy * per_step:.0f}",
            f"{counts['start-up'] / args.rate:.1f}",
        )
    Console(width=160).print(table)
    print(
        f"wall-clock a step (first to last step): {(float(last) - float(first)) / max(steps - 1, 1) * 1000:.0f} ms. "
        f"Raw samples: {raw}"
    )


if __name__ == "__main__":
    main()
