"""`streamrl replay`: off-policy retraining of a new run on a recorded run's rollouts.

The ledger picks the rollouts (`--steps`, `--where`), `producers/replay.py` plans them
into steps and re-publishes them into the new run, whose processor and learner run as
processes here (`orchestrate.replay_locally`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from streamrl.archive import archive_state
from streamrl.orchestrate import RestartPolicy, replay_locally
from streamrl.producers import replay as rp
from streamrl.producers.publisher import create_run
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.config import ConfigError, Recipe
from streamrl.runtime.db import connect
from streamrl.runtime.settings import Settings
from streamrl.runtime.sql import SqlFailed, SqlRefused


@dataclass
class ReplayOptions:
    source: str
    into: str
    recipe: Recipe | None = None  # default: the source run's config
    read_from: str = "auto"
    steps: str | None = None
    where: str | None = None
    rate: float | None = None
    correction: str | None = None
    recompute_advantages: str | None = None
    rescore: str | None = None
    out: Path | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)


def replay_run(settings: Settings, options: ReplayOptions, console: Console) -> None:
    """Select, plan, create the new run, re-publish and train. ReplayError for bad input."""
    url = settings.database_url
    with connect(url, autocommit=True) as conn:
        row = conn.execute("select config from run_events where run_id = %s and kind = 'created'", (options.source,)).fetchone()
        taken = conn.execute("select 1 from run_events where run_id = %s limit 1", (options.into,)).fetchone()
        archived = archive_state(conn, options.source)
    if archived is not None:
        raise rp.ReplayError(
            f"run {options.source!r}: its rollouts are archived in {archived['folder']}; "
            f"`streamrl restore {options.source}` puts them back in the ledger to replay them"
        )
    if row is None:
        raise rp.ReplayError(f"run {options.source!r} is not in the ledger (streamrl runs lists the runs)")
    if taken:
        raise rp.ReplayError(f"--into: run {options.into!r} already exists; choose a new id")
    try:
        source_config = Recipe.recorded(row[0])
    except ConfigError as exc:
        raise rp.ReplayError(f"run {options.source!r}: its recorded config is not a recipe of this version ({exc})") from None
    try:
        selected = rp.select_rollouts(
            settings.readonly_database_url, options.source, rp.parse_steps(options.steps), options.where
        )
    except (SqlRefused, SqlFailed) as exc:
        raise rp.ReplayError(f"--where: {exc}") from None
    groups_per_step = (options.recipe or source_config).trajectory_pool.batch_size
    plan = rp.plan_steps(selected, groups_per_step)
    if plan.steps == 0:
        raise rp.ReplayError(
            f"the selection holds {len({g for _, g in selected})} groups, fewer than one step's "
            f"{groups_per_step} (trajectory_pool.batch_size)"
        )
    config = rp.replay_config(
        source_config,
        options.recipe,
        source_run=options.source,
        plan=plan,
        source=options.read_from,
        steps=options.steps,
        where=options.where,
        correction=options.correction,
        recompute_advantages=options.recompute_advantages,
        rescore=options.rescore,
        rate=options.rate,
    )
    evaluator = rp.make_rescorer(options.rescore) if options.rescore else None  # a bad spec fails before reading
    trajectories, evaluations, origin = rp.load_rollouts(settings, options.source, plan.order, options.read_from)
    rescorer = None
    if evaluator is not None:
        task_ids = sorted({t.task_id for t in trajectories.values()})
        rescorer = (evaluator, options.rescore or "", rp.task_data(url, options.source, task_ids))
    if config.replay is None:  # a replay's recipe always has its replay section
        raise RuntimeError("the replayed run's recipe has no replay section")
    config.replay.read_from = origin
    console.print(
        f"replaying {len(plan.order)} rollouts in {len(plan.group_size_of)} groups as {plan.steps} steps "
        f"(kafka: {origin['kafka']}, ledger: {origin['ledger']}; left out: {plan.left_out_groups} groups "
        f"of a partial step); correction {config.algorithm.policy_loss}, "
        f"advantages {config.algorithm.type}",
        highlight=False,
    )
    with EventPublisher(settings, stage="app") as publisher:
        config = create_run(settings, options.into, config, publisher, parent_run_id=options.source)

    def publish(on_progress) -> int:
        return rp.publish_replay(settings, options.into, plan, trajectories, evaluations, rescorer, options.rate, on_progress)

    replay_locally(
        settings,
        options.into,
        plan.steps,
        publish,
        options.out,
        console,
        options.policy,
        trackers=bool(config.logger.trackers()),
        broker=config.service.broker,
    )
