"""`streamrl run`: every process of a run on this machine, watched through the ledger.

Starts, as separate processes (the same commands a cluster would run): the ledger sink,
the stream processor, the learner, the rollout workers and the publisher. Progress is
read from the ledger, the run's durable record, once a second. The run is over when the
learner has finished its last step and the final validation is in the ledger; then the
other processes get SIGTERM (they commit and exit), and a summary table and a
reward-curve PNG are written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from streamrl.report import RunSummary, load_summary, plot_reward_curve, val_accuracy_at
from streamrl.settings import Settings


class RunFailed(RuntimeError):
    pass


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, args: list[str], logs: Path, env: dict) -> Child:
    log_path = logs / f"{name}.log"
    handle = open(log_path, "ab")
    process = subprocess.Popen([sys.executable, "-m", "streamrl.cli", *args], stdout=handle, stderr=subprocess.STDOUT,
                               env=env, start_new_session=True)
    return Child(name, process, log_path)


def stop_children(children: list[Child], timeout_s: float = 30.0) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def child_env(settings: Settings) -> dict:
    env = dict(os.environ)
    env["STREAMRL_HOME"] = str(settings.home)
    env["STREAMRL_KAFKA_BOOTSTRAP"] = settings.kafka_bootstrap
    env["STREAMRL_DATABASE_URL"] = settings.database_url
    # Several torch processes on 2 cores stall each other unless each keeps to one thread.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def summary_table(summary: RunSummary, wall_s: float) -> Table:
    table = Table(title=f"run {summary.run_id}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    if "warmup_steps" in summary.warmup:
        before = summary.warmup.get("val_accuracy_before_warmup")  # null where only workers can validate
        if before is not None:
            table.add_row("validation accuracy, untrained model", f"{before:.3f}")
        table.add_row(f"cross-entropy warm-up ({summary.warmup['warmup_steps']} steps)",
                      f"{summary.warmup['warmup_seconds']:.0f} s")
    if summary.val_accuracy:
        table.add_row("validation accuracy, first", f"{summary.val_accuracy[0]:.3f} (version {summary.val_versions[0]})")
        table.add_row("validation accuracy, last", f"{summary.val_accuracy[-1]:.3f} (version {summary.val_versions[-1]})")
    if summary.reward_by_step:
        tail = summary.reward_by_step[-10:]
        table.add_row("train reward, last 10 steps", f"{sum(tail) / len(tail):.3f}")
    table.add_row("wall-clock", f"{wall_s:.0f} s")
    for key, value in summary.totals.items():
        table.add_row(key, f"{value:,.2f}" if value % 1 else f"{value:,.0f}")
    for key, value in summary.counts.items():
        table.add_row(key, f"{value:,}")
    return table


def run_locally(settings: Settings, recipe_file: Path | None, recipe: dict, run_id: str, workers: int,
                out: Path | None, console: Console, poll_s: float = 1.0, final_val_timeout_s: float = 180.0,
                resume: bool = False, reset_offsets: bool = False) -> RunSummary:
    out = out or settings.home / "runs" / run_id
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = child_env(settings)
    url = settings.database_url
    total = recipe["trainer"]["total_train_steps"]
    val_rows = recipe["validate"]["data"].get("max_rows")
    started = time.monotonic()
    console.print(f"run [bold]{run_id}[/]: logs in {logs}", highlight=False)

    publish = ["publish", "--resume", run_id] if resume else ["publish", str(recipe_file), "--run", run_id]
    children = [spawn("publisher", publish, logs, env)]
    # The other processes read the run's resolved config from its `created` event.
    children += [spawn("sink", ["sink", "--run", run_id], logs, env),
                 spawn("processor", ["processor", run_id], logs, env),
                 spawn("learner", ["learner", run_id] + (["--reset-offsets"] if reset_offsets else []), logs, env)]
    children += [spawn(f"worker-{i}", ["worker", run_id, "--shard", f"{i}/{workers}"], logs, env) for i in range(workers)]
    learner = next(c for c in children if c.name == "learner")
    final_val_version = total if recipe["validate"]["data"]["data_files"] else None
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[status]}"), console=console) as progress:
            bar = progress.add_task("training steps", total=total, status="starting")
            val_wait_started = None
            while True:
                time.sleep(poll_s)
                for child in children:
                    code = child.process.poll()
                    if code not in (None, 0) or (code == 0 and child.name not in ("publisher", "learner")):
                        raise RunFailed(f"{child.name} exited with code {code}; last lines of {child.log_path}:\n{child.tail()}")
                summary = load_summary(url, run_id, with_counts=False)
                latest_val = f"val acc {summary.val_accuracy[-1]:.2f} @v{summary.val_versions[-1]}" if summary.val_accuracy else "val acc -"
                reward = f"reward {sum(summary.reward_by_step[-10:]) / len(summary.reward_by_step[-10:]):.2f}" if summary.reward_by_step else "warming up"
                progress.update(bar, completed=len(summary.steps), status=f"{reward}  {latest_val}")
                if learner.process.poll() == 0 and len(summary.steps) >= total:
                    if final_val_version is None or val_accuracy_at(summary, final_val_version, val_rows) is not None:
                        break
                    val_wait_started = val_wait_started or time.monotonic()
                    if time.monotonic() - val_wait_started > final_val_timeout_s:
                        console.print("[yellow]final validation incomplete; stopping anyway[/]")
                        break
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the run's processes (they commit what they have)[/]")
        raise
    finally:
        stop_children(children)
    wall = time.monotonic() - started
    summary = load_summary(url, run_id)
    png = plot_reward_curve(summary, out / "reward_curve.png")
    console.print(summary_table(summary, wall))
    console.print(f"reward curve: {png}", highlight=False)
    console.print(f"ask the ledger: streamrl sql \"select step, metrics->>'reward_mean' as reward from train_steps "
                  f"where run_id = '{run_id}' order by step\"", highlight=False)
    return summary


def replay_locally(settings: Settings, run_id: str, steps: int, publish, out: Path | None, console: Console,
                   poll_s: float = 1.0) -> RunSummary:
    """The trainers of a replayed run (sink, processor, learner) as processes, fed by
    `publish(on_progress)` here; over when the learner has trained its last step."""
    out = out or settings.home / "runs" / run_id
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = child_env(settings)
    started = time.monotonic()
    console.print(f"replay into [bold]{run_id}[/]: logs in {logs}", highlight=False)
    children = [spawn("sink", ["sink", "--run", run_id], logs, env),
                spawn("processor", ["processor", run_id], logs, env),
                spawn("learner", ["learner", run_id], logs, env)]
    learner = children[-1]

    def check_children() -> None:
        for child in children:
            code = child.process.poll()
            if code not in (None, 0) or (code == 0 and child is not learner):
                raise RunFailed(f"{child.name} exited with code {code}; last lines of {child.log_path}:\n{child.tail()}")

    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[status]}"), console=console) as progress:
            sent = progress.add_task("replayed rollouts", total=None, status="")
            bar = progress.add_task("training steps", total=steps, status="")

            def on_progress(count: int) -> None:
                progress.update(sent, completed=count)
                check_children()

            total = publish(on_progress)
            progress.update(sent, total=total, completed=total)
            while True:
                time.sleep(poll_s)
                check_children()
                summary = load_summary(settings.database_url, run_id, with_counts=False)
                progress.update(bar, completed=len(summary.steps))
                if learner.process.poll() == 0 and len(summary.steps) >= steps and summary.finish is not None:
                    break
    finally:
        stop_children(children)
    wall = time.monotonic() - started
    summary = load_summary(settings.database_url, run_id)
    png = plot_reward_curve(summary, out / "reward_curve.png")
    table = summary_table(summary, wall)
    for key in ("val_accuracy_before_replay", "val_accuracy_after_replay"):
        value = (summary.finish or {}).get(key, summary.warmup.get(key))
        if value is not None:
            table.add_row(key.replace("_", " ").replace("val ", "validation "), f"{value:.3f}")
    console.print(table)
    console.print(f"reward curve: {png}", highlight=False)
    return summary
