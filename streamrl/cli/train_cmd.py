"""Training commands: run (everything on this machine), replay, and the processes a
cluster runs one by one (publish, worker, processor, learner)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from streamrl.cli.common import (
    CommandFailed,
    UsageError,
    check_recipe_code,
    checked_run_id,
    cli_command,
    console,
    database_url,
    forked_main,
    new_run_id,
    prepared_recipe,
    print_warnings,
    recipe_file,
    settings,
    sharding,
)
from streamrl.runtime.config import ReplaySource
from streamrl.runtime.service_config import WINDOWS_NEED_PLAIN_PROCESSOR, with_resolved_windows


def register(app: typer.Typer) -> None:
    app.command("run")(cli_command(run_recipe))
    for command in (publish, worker, processor, learner, replay):
        app.command()(cli_command(command))


InferenceUrl = Annotated[
    list[str] | None,
    typer.Option(
        "--inference-url",
        help="An existing inference server (URL or HOST:PORT; repeat for several): replaces the "
        "recipe's managed servers; needs service.inference_service.backend sglang or openai.",
    ),
]


MaxRestarts = Annotated[
    int,
    typer.Option(
        "--max-restarts",
        min=0,
        help="Restart a crashed process of the run up to N times within --restart-window "
        "(with a backoff of 1, 2, 4 ... s); one more crash ends the run. 0: no restarts.",
    ),
]
Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Recipe overrides after the file, key.path=value (trainer.lr=1e-4 data.seed=3), recorded in the run's "
        "resolved config.",
        show_default=False,
    ),
]
Tag = Annotated[
    str | None,
    typer.Option("--tag", "-t", help="A label recorded on the run (the guide's -t); `streamrl runs --tag TAG` lists its runs."),
]
RestartWindow = Annotated[
    float, typer.Option("--restart-window", min=1.0, help="Seconds over which --max-restarts counts a process's crashes.")
]


def restart_policy(max_restarts: int, window_s: float):
    from streamrl.supervise import RestartPolicy

    return RestartPolicy(max_restarts=max_restarts, window_s=window_s)


def with_url(recipe, urls: list[str] | None):
    from streamrl.runtime.recipe import with_inference_url

    return with_inference_url(recipe, urls) if urls else recipe


def run_config(current, run: str, check_assignment: bool = False):
    """The run's typed config, from its `created` event (every process but the publisher
    starts from the run id alone); `check_assignment` for a worker or processor."""
    from streamrl.runtime.runs import fetch_run_config

    try:
        return fetch_run_config(current, run, check_assignment=check_assignment)
    except RuntimeError as exc:  # its topics do not exist
        raise CommandFailed(str(exc)) from None


def run_recipe(
    file: Annotated[
        Path | None, typer.Argument(help="The recipe YAML, or builtin:NAME for a recipe StreamRL ships (not with --resume).")
    ] = None,
    overrides: Overrides = None,
    resume: Annotated[
        str | None,
        typer.Option(help="Finish RUN after a crash or a broker restart: what the broker lost is rebuilt from the ledger."),
    ] = None,
    run: Annotated[str | None, typer.Option(help="Run id (default: experiment name + time).")] = None,
    workers: Annotated[int | None, typer.Option(help="Rollout worker processes (default: rollout_worker.num_workers).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for the summary and reward curve (default: STREAMRL_HOME/runs/RUN).")
    ] = None,
    inference_url: InferenceUrl = None,
    max_restarts: MaxRestarts = 5,
    restart_window: RestartWindow = 600.0,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode",
            "-m",
            help="self-hosted (StreamRL's learner trains the "
            "model here) or training-service (trainer.type remote_api_*: "
            "no model here, steps go to service.train_service). Default: "
            "what the recipe's trainer.type implies.",
        ),
    ] = None,
    train_config: Annotated[
        Path | None,
        typer.Option("--train-config", "-c", help="The recipe YAML, the guide's way (`-c FILE -r`); instead of FILE."),
    ] = None,
    run_now: Annotated[
        bool, typer.Option("--run-nexrl", "-r", help="With -c: start the run now; without it, -c only prints what would run.")
    ] = False,
    tag: Tag = None,
    ctx: typer.Context = None,  # type: ignore[assignment]  # given by typer; None from streamrl.train
) -> tuple[str, Any] | None:  # (run id, RunSummary); typer reads this annotation at start
    """Train a recipe end to end on this machine: start the services if needed, then the
    ledger sink, stream processor, learner, rollout workers and publisher as processes,
    with progress bars; at the end a summary table and a reward-curve PNG. The guide's
    form, `-m MODE -c FILE -r -t TAG`, does the same."""
    from streamrl.orchestrate import RunFailed, run_locally
    from streamrl.recovery import prepare_resume
    from streamrl.runtime import db, services
    from streamrl.supervise import forking_supported

    current = settings()
    if train_config is not None:
        if file is not None and "=" in str(file):  # `-c FILE key=value`: the first override took FILE's place
            overrides, file = [str(file), *(overrides or [])], None
        if file is not None:
            raise UsageError("give the recipe as FILE or as -c/--train-config, not both")
        file = train_config
    elif run_now:
        raise UsageError("-r/--run-nexrl goes with -c/--train-config (FILE alone runs at once)")
    if (file is None) == (resume is None):
        raise UsageError("give a recipe FILE or --resume RUN, not both or neither")
    file = recipe_file(file) if file is not None else None
    # The recipe's own code is loaded and checked (torch imported: seconds on a small
    # machine) while the learner and workers start: run_locally calls code_check before
    # it starts the publisher, which creates the run, so a refused recipe records nothing.
    recipe = None
    code_check = None
    if file is not None:
        recipe = with_url(prepared_recipe(file, overrides, load_code=False), inference_url)
        check_mode(mode, recipe)
        print_warnings(recipe)
        if train_config is not None and not run_now:
            check_recipe_code(file, recipe)
            print_plan(recipe, file, workers)
            return None
        check_training_service(recipe)
        code_check = functools.partial(check_recipe_code, file, recipe)
    if resume and inference_url:
        raise UsageError(
            "--inference-url: a resumed run keeps its recorded servers; give it to `streamrl worker RUN --inference-url` instead"
        )
    for line in services.up(current):
        console.print(line, highlight=False)
    db.upgrade(database_url(current))
    if resume:
        try:
            resumed = prepare_resume(current, resume)
        except LookupError as exc:
            raise UsageError(str(exc)) from None
        run, recipe = resume, resumed.recipe
        console.print(resumed.describe(run), highlight=False)
        check_mode(mode, recipe)
    if recipe is None:  # FILE or --resume gave one (checked above)
        raise UsageError("give a recipe FILE or --resume RUN")
    # a new run's windows, as its publisher will record them (a resumed run's were recorded)
    assigned = current.partition_assignment if os.environ.get("STREAMRL_PARTITION_ASSIGNMENT") else "shard"
    recipe = with_resolved_windows(recipe, current.embedded_kafka, assigned)
    if not os.environ.get("STREAMRL_PARTITION_ASSIGNMENT"):
        assignment = resumed.partition_assignment if resume else "shard"
        if assignment is None:  # a run started before its assignment was recorded
            assignment = "shard" if recipe.service.broker.window_steps is not None else "group"
        current = dataclasses.replace(current, partition_assignment=assignment)
    elif recipe.service.broker.window_steps is not None and current.partition_assignment == "group":
        raise UsageError(WINDOWS_NEED_PLAIN_PROCESSOR)  # asked for by name: refused, not overridden
    run = checked_run_id(run or new_run_id(recipe.experiment_name), "--run")
    try:
        summary = run_locally(
            current,
            file,
            recipe,
            run,
            workers or recipe.rollout_worker.num_workers,
            out,
            console,
            resume=bool(resume),
            reset_offsets=bool(resume) and resumed.rebuilt.topics_recreated,
            inference_urls=inference_url,
            policy=restart_policy(max_restarts, restart_window),
            overrides=overrides,
            tag=tag,
            code_check=code_check,
            # Forked only from the command line: streamrl.train runs in the user's process,
            # whose threads and state (a CUDA context, say) a fork would copy.
            fork_entry=functools.partial(forked_main, ctx.find_root().command)
            if ctx is not None and forking_supported()
            else None,
        )
    except RunFailed as exc:
        raise CommandFailed(str(exc), "run failed") from None
    return run, summary


MODES = ("self-hosted", "training-service")


def print_plan(recipe, file: Path, workers: int | None) -> None:
    """What `-c FILE` without `-r` would run (the guide's launcher prints before it starts)."""
    remote = recipe.service.train_service.backend != "none"
    processes = [
        "sink",
        "processor",
        "remote-trainer" if remote else "learner",
        f"{workers or recipe.rollout_worker.num_workers} rollout worker(s)",
        "publisher",
    ]
    console.print(
        f"{file}: would run {recipe.project_name}/{recipe.experiment_name} "
        f"({'training-service' if remote else 'self-hosted'}; trainer {recipe.trainer.type}, "
        f"{recipe.trainer.total_train_steps} steps, {recipe.service.inference_service.backend} inference) "
        f"as {', '.join(processes)}. Add -r to start it.",
        highlight=False,
    )


def check_mode(mode: str | None, recipe) -> None:
    """The guide's launch modes: the recipe's trainer must be the mode's kind."""
    from streamrl.runtime.recipe import REMOTE_TRAINER_TYPES

    if mode is None:
        return
    if mode not in MODES:
        raise UsageError(f"--mode: {mode!r} is not one of {', '.join(MODES)}")
    remote = recipe.trainer.type in REMOTE_TRAINER_TYPES
    if remote != (mode == "training-service"):
        raise UsageError(
            f"--mode {mode}: trainer.type is {recipe.trainer.type}; training-service needs "
            f"{' or '.join(REMOTE_TRAINER_TYPES)} (with service.train_service), self-hosted any other"
        )


def check_training_service(recipe) -> None:
    """A remote trainer's service answers and takes the key before any process starts
    (otherwise one sentence says which not)."""

    service = recipe.service.train_service
    if service.backend == "tinker" and service.url:
        from streamrl.learner.remote_policy import wait_until_healthy

        wait_until_healthy(
            service.url.rstrip("/"),
            recipe.service.tinker_service.api_key or os.environ.get("TINKER_API_KEY"),
            tries=3,
            then="then run this command again",
        )


def publish(
    file: Annotated[Path | None, typer.Argument(help="The recipe YAML (not with --resume).")] = None,
    overrides: Overrides = None,
    run: Annotated[str | None, typer.Option(help="Run id (default: experiment name + time).")] = None,
    resume: Annotated[
        str | None,
        typer.Option(
            help="Resume publishing RUN: its config from the ledger; tasks "
            "already rolled out and evaluated are not published again."
        ),
    ] = None,
    inference_url: InferenceUrl = None,
    tag: Tag = None,
    checked: Annotated[
        bool,
        typer.Option(
            "--checked",
            hidden=True,
            help="The recipe's code and registry keys "
            "were checked by the `streamrl run` that starts this publisher: its "
            "settings are still checked, its code is not loaded again.",
        ),
    ] = False,
) -> None:
    """Create a run from a recipe (its topics, and a `created` event holding the resolved
    config) and publish its tasks, paced by the weight versions the learner publishes."""
    from streamrl.producers.publisher import create_run, run_publisher
    from streamrl.recovery import finished_task_ids
    from streamrl.runtime.bus import EventPublisher
    from streamrl.runtime.runs import stop_on_signals

    current = settings()
    if (file is None) == (resume is None):
        raise UsageError("give a recipe FILE or --resume RUN, not both or neither")
    skip: set[str] = set()
    if resume:
        run, recipe = resume, run_config(current, resume)
        skip = finished_task_ids(database_url(current), run)
        console.print(f"resuming run {run}: {len(skip)} tasks already done", highlight=False)
    elif file is not None:
        file = recipe_file(file)
        recipe = with_url(prepared_recipe(file, overrides, load_code=not checked), inference_url)
        run = checked_run_id(run or new_run_id(recipe.experiment_name), "--run")
        with EventPublisher(current, stage="app") as publisher:
            recipe = create_run(current, run, recipe, publisher, tag=tag)
        console.print(f"run {run}", highlight=False)
    if run is None:  # FILE or --resume gave one (checked above)
        raise UsageError("give a recipe FILE or --resume RUN")
    steps = run_publisher(current, run, recipe, stop_on_signals(), skip_task_ids=skip)
    console.print(f"published the tasks of {steps} steps", highlight=False)


def worker(
    run: Annotated[str, typer.Argument(help="Run id.")],
    name: Annotated[
        str | None,
        typer.Option(
            help="This worker's name in the run's worker group (default: the "
            "host name); a restart under the same name is the same member."
        ),
    ] = None,
    shard: Annotated[
        str, typer.Option(help="I/N: serve the tasks partitions p with p % N == I (STREAMRL_PARTITION_ASSIGNMENT=shard only).")
    ] = "0/1",
    idle_exit: Annotated[float | None, typer.Option(help="Exit after this many seconds without tasks.")] = None,
    inference_url: InferenceUrl = None,
) -> None:
    """Roll out RUN's tasks: trajectories and evaluations out, offsets committed after.
    SIGTERM/SIGINT finish the tasks in flight, commit and exit 0."""
    import torch

    from streamrl.producers.worker_loop import run_worker
    from streamrl.runtime.runs import stop_on_signals
    from streamrl.runtime.threads import worker_threads

    # What the worker does to its inference servers (started, restarted, re-synced) goes to its log.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("streamrl").setLevel(logging.INFO)
    current = settings()
    index_count = sharding(current, shard)
    recipe = with_url(run_config(current, run, check_assignment=True), inference_url)
    torch.set_num_threads(worker_threads(recipe))
    done = run_worker(current, run, recipe, index_count, stop_on_signals(), idle_exit_s=idle_exit, name=name)
    console.print(f"worker stopped after {done} tasks", highlight=False)


def processor(
    run: Annotated[str, typer.Argument(help="Run id.")],
    name: Annotated[
        str | None, typer.Option(help="This processor's name in the run's processor group (default: the host name).")
    ] = None,
    shard: Annotated[
        str, typer.Option(help="I/N: process the partitions p with p % N == I (STREAMRL_PARTITION_ASSIGNMENT=shard only).")
    ] = "0/1",
    idle_exit: Annotated[
        float | None,
        typer.Option(help="Exit after this many idle seconds with no open group (STREAMRL_PARTITION_ASSIGNMENT=shard only)."),
    ] = None,
) -> None:
    """Join RUN's trajectories with their evaluations, complete groups, compute advantages
    and emit samples (or a GroupFiltered record for a group that gives none). By default
    a faust app in the run's processor group: start as many as you like."""

    from streamrl.runtime.runs import stop_on_signals

    current = settings()
    index_count = sharding(current, shard)
    recipe = run_config(current, run, check_assignment=True)
    if current.partition_assignment == "group":
        from streamrl.consumers.faust_processor import FaustProcessor

        if recipe.service.broker.window_steps is not None:
            raise UsageError(WINDOWS_NEED_PLAIN_PROCESSOR)

        if idle_exit is not None:
            raise UsageError(
                "--idle-exit: a processor in a consumer group runs until stopped "
                "(STREAMRL_PARTITION_ASSIGNMENT=shard for the plain loop that can idle out)"
            )
        from streamrl.cli.common import debugging

        FaustProcessor(current, run, recipe, name or os.uname().nodename).run(tracebacks=debugging())
        console.print("processor stopped", highlight=False)
        return
    from streamrl.consumers.processor import StreamProcessor

    stop = stop_on_signals()
    stream = StreamProcessor(current, run, recipe, index_count)
    console.print(f"processor running: run {run} (SIGTERM or Ctrl-C stops it)", highlight=False)
    try:
        stats = stream.run(stop, idle_exit_s=idle_exit)
    finally:
        stream.close()
    console.print(
        f"processor stopped: {stats.groups} groups, {stats.samples} samples, filtered {stats.filtered}", highlight=False
    )


def learner(
    run: Annotated[str, typer.Argument(help="Run id.")],
    reset_offsets: Annotated[
        bool,
        typer.Option(
            "--reset-offsets",
            help="Read the samples topic from its start (the broker lost the topics the checkpoint's offsets refer to).",
        ),
    ] = False,
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(
            "--rdzv-endpoint",
            help="HOST:PORT where the learner's nodes meet (trainer.nnodes > 1): the same on every node; the node "
            "whose --local-addr is HOST keeps the rendezvous store.",
        ),
    ] = None,
    local_addr: Annotated[
        str | None,
        typer.Option(
            "--local-addr",
            help="This node's address the other nodes reach (trainer.nnodes > 1): the ranks' process group "
            "listens on the interface that holds it.",
        ),
    ] = None,
) -> None:
    """Train RUN: batches of samples, optimizer steps, a checkpoint and a weight version
    per step. Restarted, it resumes after its last checkpointed step."""
    from streamrl.learner.first_version import announce_model_as_version_zero
    from streamrl.runtime.runs import stop_on_signals

    current = settings()
    recipe = run_config(current, run)
    launch_ranks_if_asked(recipe, run, reset_offsets, Rendezvous.checked(recipe, rdzv_endpoint, local_addr))
    # before torch and transformers are imported: sampling can start while they load
    announced = announce_model_as_version_zero(current, run, recipe)
    from streamrl.learner.loop import Learner

    stop = stop_on_signals()
    trainer = Learner(current, run, recipe, version_zero_announced=announced)
    if reset_offsets:
        trainer.start_offsets = None  # samples of checkpointed steps are skipped by step number

    def report(record):
        console.print(
            f"step {record.step:5d}  reward {record.metrics.get('reward_mean', 0):.3f}  "
            f"loss {record.loss:+.4f}  samples {record.samples}  {record.seconds:.2f}s",
            highlight=False,
        )

    try:
        steps = trainer.run(stop, on_step=report)
    except Exception as exc:
        from streamrl.learner.failure import record_failure

        record_failure(current, run, trainer.step, exc)
        raise
    finally:
        trainer.close()
    console.print(f"learner stopped after step {steps}", highlight=False)


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """Where a learner of several nodes meets its other nodes (torchrun's c10d rendezvous)."""

    endpoint: str  # HOST:PORT, the same on every node
    local_addr: str  # this node's address

    @property
    def is_host(self) -> bool:
        """This node keeps the rendezvous store. Said explicitly: torch's guess compares
        host names, which every container or network namespace of a machine shares."""
        return self.endpoint.rsplit(":", 1)[0].strip("[]") == self.local_addr

    @classmethod
    def checked(cls, recipe, endpoint: str | None, local_addr: str | None) -> Rendezvous | None:
        nnodes = recipe.trainer.nnodes
        if "WORLD_SIZE" in os.environ:  # a rank torchrun started: it was launched already
            return None
        if nnodes == 1:
            if endpoint or local_addr:
                raise UsageError("--rdzv-endpoint/--local-addr: trainer.nnodes is 1, so there are no other nodes to meet")
            return None
        if not endpoint or not local_addr:
            raise UsageError(
                f"trainer.nnodes is {nnodes}: start `streamrl learner RUN --rdzv-endpoint HOST:PORT --local-addr ADDR` "
                "on every node (HOST:PORT the same everywhere, ADDR each node's own address)"
            )
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT")
        return cls(endpoint, local_addr)


def interface_of(address: str) -> str:
    """The network interface that holds `address` (gloo listens on it)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    raise UsageError(f"--local-addr {address}: no interface of this host has that address")


def launch_ranks_if_asked(recipe, run: str, reset_offsets: bool, rendezvous: Rendezvous | None = None) -> None:
    """`trainer.nproc_per_node` > 1 or `trainer.nnodes` > 1: become torchrun, which starts
    this node's learner processes of this same command (they see WORLD_SIZE and train as
    ranks). One node rendezvous on its own; several meet at `rendezvous`."""
    import sys

    cfg = recipe.trainer
    if "WORLD_SIZE" in os.environ or (cfg.nproc_per_node == 1 and cfg.nnodes == 1):
        return
    if rendezvous is None:
        where = ["--standalone"]
    else:
        # gloo finds its own address from the host name unless told the interface: in a
        # container or namespace that name is the machine's, not this node's
        os.environ["GLOO_SOCKET_IFNAME"] = interface_of(rendezvous.local_addr)
        os.environ["STREAMRL_LEARNER_ADDR"] = rendezvous.local_addr  # named in a failure (record_learner_failure)
        where = [
            f"--nnodes={cfg.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rendezvous.endpoint}",
            f"--rdzv-id={run}",
            f"--rdzv-conf=is_host={str(rendezvous.is_host).lower()}",
            f"--local-addr={rendezvous.local_addr}",
        ]
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc_per_node={cfg.nproc_per_node}",
        "-m",
        "streamrl.cli",
        "learner",
        run,
    ] + (["--reset-offsets"] if reset_offsets else [])
    nodes = f" on node {rendezvous.local_addr} of {cfg.nnodes} (rendezvous {rendezvous.endpoint})" if rendezvous else ""
    console.print(f"learner: {cfg.nproc_per_node} processes under torchrun{nodes}", highlight=False)
    sys.stdout.flush()
    os.execv(sys.executable, args)


def replay(
    source: Annotated[str, typer.Argument(help="The recorded run to replay.")],
    into: Annotated[str, typer.Option("--into", help="Id of the new run that trains on the replayed rollouts.")],
    recipe_file: Annotated[
        Path | None, typer.Option("--recipe", help="Train with this recipe (default: the source run's config).")
    ] = None,
    source_kind: Annotated[ReplaySource, typer.Option("--from", help="Where the payloads are read.")] = ReplaySource.auto,
    steps: Annotated[str | None, typer.Option(help="A:B: only the source's steps A to B (inclusive).")] = None,
    where: Annotated[str | None, typer.Option(help="SQL condition over t (trajectories) and e (evaluations).")] = None,
    rate: Annotated[float | None, typer.Option(help="Re-publish at most N rollouts a second.")] = None,
    correction: Annotated[
        str | None,
        typer.Option(
            help="A registered off-policy correction: truncated_is | decoupled_ppo (default: the recipe's, else truncated_is)."
        ),
    ] = None,
    recompute_advantages: Annotated[
        str | None, typer.Option("--recompute-advantages", help="Advantage estimator for the new run (e.g. dr_grpo).")
    ] = None,
    rescore: Annotated[
        str | None, typer.Option("--rescore", help="Re-evaluate with this evaluator, file.py:Class or builtin:NAME.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for the summary and reward curve.")] = None,
    max_restarts: MaxRestarts = 5,
    restart_window: RestartWindow = 600.0,
) -> None:
    """Retrain off-policy on a recorded run's rollouts: re-publish its trajectories and
    evaluations (behaviour logprobs and weight versions included) into a new run whose
    processor recomputes advantages and whose learner trains with an off-policy
    correction. The new run records its parent run and each source event id."""
    from streamrl.orchestrate import RunFailed
    from streamrl.producers.replay import ReplayError
    from streamrl.replaying import ReplayOptions, replay_run

    current = settings()
    database_url(current)
    options = ReplayOptions(
        source=source,
        into=checked_run_id(into, "--into"),
        recipe=prepared_recipe(recipe_file) if recipe_file else None,
        read_from=source_kind.value,
        steps=steps,
        where=where,
        rate=rate,
        correction=correction,
        recompute_advantages=recompute_advantages,
        rescore=rescore,
        out=out,
        policy=restart_policy(max_restarts, restart_window),
    )
    try:
        replay_run(current, options, console)
    except ReplayError as exc:
        raise UsageError(str(exc)) from None
    except RunFailed as exc:
        raise CommandFailed(str(exc), "replay failed") from None
