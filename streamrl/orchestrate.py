"""`streamrl run` and `streamrl replay`: a run's processes on this machine, watched
through the ledger.

Starts, as separate processes (the same commands a cluster would run): the ledger sink,
the stream processor, the learner and, for a run, the rollout workers and the
publisher. Progress is read from the ledger, the run's durable record, once a second.
A run is over when the learner has finished its last step and the final validation is
in the ledger; then the other processes get SIGTERM (they commit and exit), and a
summary table and a reward-curve PNG are written.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from streamrl.failures import StepWatch, first_errors_text, load_failures
from streamrl.report import RunSummary, load_summary, plot_reward_curve, summary_table, val_complete
from streamrl.runtime.config import FailureBudget, Recipe
from streamrl.runtime.dataset import total_train_steps, validation_rows
from streamrl.runtime.db import connect
from streamrl.runtime.service_config import Broker
from streamrl.runtime.services import broker_memory_bytes
from streamrl.runtime.settings import SUPERVISED, Settings
from streamrl.runtime.topic_retention import retire_run_topics
from streamrl.runtime.topic_windows import windows_left
from streamrl.supervise import RestartPolicy, RunFailed, Supervisor

__all__ = ["RestartPolicy", "RunFailed", "replay_locally", "run_locally"]


# Several torch processes on 2 cores stall each other unless each keeps to one thread.
THREAD_DEFAULTS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def child_env(settings: Settings) -> dict:
    env = dict(os.environ)
    env["STREAMRL_HOME"] = str(settings.home)
    env["STREAMRL_KAFKA_BOOTSTRAP"] = settings.kafka_bootstrap
    env["STREAMRL_DATABASE_URL"] = settings.database_url
    env["STREAMRL_PARTITION_ASSIGNMENT"] = settings.partition_assignment
    env[SUPERVISED] = "1"  # this command restarts a crashed process, and records the run's failure itself
    for key, value in THREAD_DEFAULTS.items():
        env.setdefault(key, value)
    return env


@dataclass
class LocalRun:
    """The processes of one run, their logs under `out/logs`, supervised (restarted when
    they crash, by `policy`) and stopped together."""

    settings: Settings
    run_id: str
    out: Path
    console: Console
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    broker: Broker = field(default_factory=Broker)

    fork_entry: Callable[[list[str]], int] | None = None  # children forked from this process (Supervisor)

    def __post_init__(self):
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(self.logs, child_env(self.settings), self.policy, self.say, self.fork_entry)
        self.spawn, self.check, self.stop = self.supervisor.spawn, self.supervisor.check, self.supervisor.stop
        self.broker_warned = False

    def restarts_note(self) -> str:
        count = sum(self.supervisor.restarts.values())
        return f"restarts {count}" if count else ""

    def broker_note(self) -> str:
        """The embedded broker's memory for the progress line; past the recipe's share of
        the machine's memory, said once with what grows and what to do."""
        import psutil

        rss = broker_memory_bytes(self.settings)
        if rss is None:
            return ""
        total = psutil.virtual_memory().total
        if not self.broker_warned and rss > self.broker.memory_warning_share * total:
            self.broker_warned = True
            self.say(
                f"the embedded broker holds {rss / 2**30:.1f} GiB, over "
                f"{self.broker.memory_warning_share:.0%} of this machine's {total / 2**30:.0f} GiB: it keeps "
                "every event of the runs it carries in memory (a finished run's topics leave it with "
                "service.broker.retention: remove); for long runs, point STREAMRL_KAFKA_BOOTSTRAP at a Kafka "
                "cluster"
            )
        return f"broker {rss / 2**20:.0f} MB"

    def retire_topics(self) -> None:
        """The run is over and its processes stopped: free its topics (retention: remove)."""
        if self.broker.retention == "keep":
            return
        try:
            self.say(retire_run_topics(self.settings, self.run_id).sentence(self.run_id))
        except Exception as error:  # the run itself succeeded; say why the topics stay
            self.say(f"kept run {self.run_id}'s topics on the broker: removing them failed ({error})")

    def say(self, line: str) -> None:
        """A supervision event: on the console and in logs/supervisor.log."""
        self.console.print(f"[yellow]{line}[/]", highlight=False)
        with open(self.logs / "supervisor.log", "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")

    def follow(
        self,
        console: Console,
        total_steps: int,
        finished: Callable[[RunSummary], bool],
        poll_s: float = 1.0,
        before: Callable[[Progress], None] | None = None,
        rollouts: StepWatch | None = None,
        budget: FailureBudget | None = None,
    ) -> RunSummary:
        """Progress bars until `finished(summary)`; then the processes are stopped and the
        summary table and reward curve written. While the ledger does not answer, the
        line says so and the processes wait for it (they give up, and so does the run,
        after `STREAMRL_SERVICE_WAIT_S`). With `rollouts` and `budget`, failed rollouts
        are counted on the line, and past the budget the run fails (RunFailed). A failed
        run is marked failed in the ledger, with why."""
        started = time.monotonic()
        try:
            summary = self._follow(console, total_steps, finished, poll_s, before, rollouts, budget)
        except RunFailed as failed:  # its processes are stopped (_follow's finally)
            why = self.record_failed(str(failed))
            raise RunFailed(why) from None
        windows = self.broker.resolved_windows()
        if windows:
            self.say(windows_left(self.settings, self.run_id, total_steps, windows))
        self.retire_topics()
        wall = time.monotonic() - started
        summary = load_summary(self.settings.database_url, self.run_id)
        png = reward_curve_png(summary, self.out / "reward_curve.png")
        table = summary_table(summary, wall)
        table.add_row("process restarts", self.supervisor.restarts_text())
        for key in ("val_accuracy_before_replay", "val_accuracy_after_replay"):
            value = (summary.finish or {}).get(key, summary.warmup.get(key))
            if value is not None:
                table.add_row(key.replace("_", " ").replace("val ", "validation "), f"{value:.3f}")
        with connect(self.settings.database_url, autocommit=True) as conn:
            failures = load_failures(conn, self.run_id)
        for kind, count in sorted(failures.counts.items()):
            table.add_row(kind, f"{count:,}")
        console.print(table)
        for line in first_errors_text(failures):
            console.print(line, highlight=False, markup=False)
        console.print(f"reward curve: {png}", highlight=False)
        return summary

    def record_failed(self, why: str) -> str:
        """The run's `failed` event, written to the ledger here (its processes are
        stopped: the sink may be the one that failed); returns `why` with the first error
        of each failed-rollout kind, as the ledger has them."""
        from streamrl.consumers.ledger_writes import Placed, create_staging_tables, insert_events
        from streamrl.schema.events import RunEvent
        from streamrl.schema.topics import topic_name

        try:
            with connect(self.settings.database_url, autocommit=True) as conn:
                failures = load_failures(conn, self.run_id)
                why = "\n".join([why, *first_errors_text(failures)])
                query = "select count(*) from run_events where run_id = %s and kind = 'failed'"
                (earlier,) = conn.execute(query, (self.run_id,)).fetchone() or (0,)
                event = RunEvent(
                    run_id=self.run_id,
                    kind="failed",
                    sequence=earlier,  # a resumed run may fail again
                    name="streamrl run",
                    message=why,
                    details={"failures": failures.counts},
                )
                create_staging_tables(conn)
                with conn.transaction():
                    insert_events(conn, [Placed(event, topic_name(self.run_id, "runs"), -1, -1)])
        except psycopg.Error as error:
            self.say(f"could not mark run {self.run_id} failed in the ledger: {error}")
        with open(self.logs / "supervisor.log", "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} run failed: {why}\n")
        return why

    def _follow(self, console, total_steps, finished, poll_s, before, rollouts, budget) -> RunSummary:
        summary = None
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=console,
            ) as progress:
                if before:
                    before(progress)
                bar = progress.add_task("training steps", total=total_steps, status="starting")
                while True:
                    # every step trained: what is left (the learner's exit, the final
                    # validation) is watched closely, so that the run ends when they do
                    trained = summary is not None and len(summary.steps) >= total_steps
                    time.sleep(min(poll_s, 0.2) if trained else poll_s)
                    self.check()
                    try:
                        summary = load_summary(self.settings.database_url, self.run_id, with_counts=False)
                        if rollouts is not None:
                            with connect(self.settings.database_url, autocommit=True) as conn:
                                rollouts.poll(conn, self.run_id, len(summary.steps))
                    except psycopg.OperationalError:
                        progress.update(bar, status=f"waiting for the ledger's PostgreSQL  {self.restarts_note()}")
                        continue
                    failed = rollouts.note() if rollouts is not None else ""
                    notes = "  ".join(note for note in (failed, self.broker_note(), self.restarts_note()) if note)
                    progress.update(bar, completed=len(summary.steps), status=f"{status_line(summary)}  {notes}".rstrip())
                    breach = rollouts.breach(budget) if rollouts is not None and budget is not None else None
                    if breach:
                        raise RunFailed(f"run {self.run_id} failed: {breach}")
                    if finished(summary):
                        break
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping the run's processes (they commit what they have)[/]")
            raise
        finally:
            self.stop()
        assert summary is not None
        return summary


def reward_curve_png(summary: RunSummary, path: Path) -> str:
    """The reward curve's file, or the sentence saying why none was drawn."""
    from streamrl.runtime.extras import missing_extra

    try:
        return str(plot_reward_curve(summary, path))
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc, "the reward curve")
        if missing is None:
            raise
        return f"not drawn: {missing}"


def status_line(summary: RunSummary) -> str:
    latest_val = "val acc -"
    if summary.val_accuracy:
        accuracy, errored, count = summary.val_accuracy[-1], summary.val_errored[-1], summary.val_counts[-1]
        shown = f"n/a ({errored} of {count} errored)" if accuracy is None else f"{accuracy:.2f}"
        latest_val = f"val acc {shown} @v{summary.val_versions[-1]}"
    tail = summary.reward_by_step[-10:]
    reward = f"reward {sum(tail) / len(tail):.2f}" if tail else "warming up"
    return f"{reward}  {latest_val}"


def preload_for_children() -> None:
    """Imports the run's children make at their start (torch, transformers, the
    learner's, workers', processor's, sink's and publisher's modules: several
    CPU-seconds each on a small machine), made once here so that children forked from
    this process start with them. Torch's threads follow the children's settings, as
    they would in a child started on its own."""
    for key, value in THREAD_DEFAULTS.items():
        os.environ.setdefault(key, value)
    import transformers.modeling_layers
    import transformers.models.auto.auto_factory  # noqa: F401

    import streamrl.consumers.ledger_sink
    import streamrl.learner.first_version
    import streamrl.learner.loop
    import streamrl.producers.publisher
    import streamrl.producers.worker_loop
    import streamrl.recovery
    import streamrl.runtime.runs  # noqa: F401


def interrupt_on_sigterm() -> None:
    """SIGTERM (a scheduler, `timeout`, `kill`) stops the run as Ctrl-C does: its
    processes are stopped and commit what they have, instead of being left running."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run_locally(
    settings: Settings,
    recipe_file: Path | None,
    recipe: Recipe,
    run_id: str,
    workers: int,
    out: Path | None,
    console: Console,
    final_val_timeout_s: float = 180.0,
    resume: bool = False,
    reset_offsets: bool = False,
    inference_urls: list[str] | None = None,
    policy: RestartPolicy = RestartPolicy(),
    overrides: list[str] | None = None,
    tag: str | None = None,
    code_check: Callable[[], None] | None = None,
    fork_entry: Callable[[list[str]], int] | None = None,
) -> RunSummary:
    """`code_check` (a fresh run): loads and checks the recipe's code, raising what it
    finds; it runs while the learner and workers start (their imports are most of a
    run's start), before the publisher creates the run. `fork_entry` (the CLI's entry
    point): the children are forked from this process once it has imported what they
    import, instead of each importing it again."""
    interrupt_on_sigterm()
    if fork_entry is not None:
        preload_for_children()
    local = LocalRun(settings, run_id, out or settings.home / "runs" / run_id, console, policy, recipe.service.broker, fork_entry)
    total = total_train_steps(recipe)  # the same count the publisher and the learner use
    val = recipe.validate.data
    val_rows = len(validation_rows(val.data_files, val.type, val.max_rows))  # what each validation scores
    console.print(f"run [bold]{run_id}[/]: logs in {local.logs}", highlight=False)
    # The learner and the workers start first: importing torch and transformers and
    # building the model is most of a run's start. They wait for the run's `created`
    # event, which the publisher writes from the same recipe and overrides (the resolved
    # config every other process reads).
    role = "remote-trainer" if recipe.service.train_service.backend != "none" else "learner"
    learner = local.spawn(role, ["learner", run_id] + (["--reset-offsets"] if reset_offsets else []), may_finish=True)
    for i in range(workers):  # group members by name, or fixed shards (STREAMRL_PARTITION_ASSIGNMENT)
        placement = ["--name", f"worker-{i}"] if settings.partition_assignment == "group" else ["--shard", f"{i}/{workers}"]
        local.spawn(f"worker-{i}", ["worker", run_id, *placement])
    if code_check is not None:
        try:
            code_check()
        except BaseException:  # refused before the run exists: nothing is recorded
            local.stop()
            raise
    publish = (
        ["publish", "--resume", run_id]
        if resume
        else ["publish", str(recipe_file), *(overrides or []), "--run", run_id, "--checked", *(["--tag", tag] if tag else [])]
    )
    publish += [arg for url in inference_urls or [] for arg in ("--inference-url", url)]
    # Restarted, the publisher resumes: the run exists, and tasks already done are skipped.
    local.spawn("publisher", publish, may_finish=True, restart_args=["publish", "--resume", run_id])
    local.spawn("sink", ["sink", "--run", run_id])
    local.spawn("processor", ["processor", run_id])
    if recipe.logger.trackers():  # W&B / TensorBoard / MLflow, fed from the topics; training never waits for it
        local.spawn("tracker", ["tracker", run_id], optional=f"`streamrl export {run_id} --to ...` back-fills the trackers")
    final_val_version = total if val_rows else None
    val_wait_started = None

    def finished(summary: RunSummary) -> bool:
        nonlocal val_wait_started
        if not local.supervisor.finished(learner) or len(summary.steps) < total:
            return False
        if final_val_version is None or val_complete(summary, final_val_version, val_rows):
            return True
        val_wait_started = val_wait_started or time.monotonic()
        if time.monotonic() - val_wait_started > final_val_timeout_s:
            scored = dict(zip(summary.val_versions, summary.val_counts)).get(final_val_version, 0)
            console.print(
                f"[yellow]final validation incomplete: {scored} of {val_rows} held-out rows scored at version "
                f"{final_val_version} after {final_val_timeout_s:.0f} s; stopping anyway[/]"
            )
            return True
        return False

    per_step = recipe.trajectory_pool.batch_size * recipe.rollout_worker.rollout_repeat_n
    rollouts = StepWatch(per_step=per_step, per_validation=val_rows)
    summary = local.follow(console, total, finished, rollouts=rollouts, budget=recipe.failure_budget)
    console.print(
        f"ask the ledger: streamrl sql \"select step, metrics->>'reward_mean' as reward from train_steps "
        f"where run_id = '{run_id}' order by step\"",
        highlight=False,
        markup=False,
    )
    return summary


def replay_locally(
    settings: Settings,
    run_id: str,
    steps: int,
    publish,
    out: Path | None,
    console: Console,
    policy: RestartPolicy = RestartPolicy(),
    trackers: bool = False,
    broker: Broker | None = None,
) -> RunSummary:
    """The trainers of a replayed run (sink, processor, learner) as processes, fed by
    `publish(on_progress)` here; over when the learner has trained its last step."""
    local = LocalRun(settings, run_id, out or settings.home / "runs" / run_id, console, policy, broker or Broker())
    console.print(f"replay into [bold]{run_id}[/]: logs in {local.logs}", highlight=False)
    local.spawn("sink", ["sink", "--run", run_id])
    local.spawn("processor", ["processor", run_id])
    learner = local.spawn("learner", ["learner", run_id], may_finish=True)
    if trackers:
        local.spawn("tracker", ["tracker", run_id], optional=f"`streamrl export {run_id} --to ...` back-fills the trackers")

    def publish_all(progress: Progress) -> None:
        sent = progress.add_task("replayed rollouts", total=None, status="")

        def on_progress(count: int) -> None:
            progress.update(sent, completed=count)
            local.check()

        total = publish(on_progress)
        progress.update(sent, total=total, completed=total)

    def finished(summary: RunSummary) -> bool:
        return local.supervisor.finished(learner) and len(summary.steps) >= steps and summary.finish is not None

    return local.follow(console, steps, finished, before=publish_all)
