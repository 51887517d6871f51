"""Replay: a recorded run's rollouts re-published into a new run that trains on them
off-policy, without generating anything.

    streamrl replay SOURCE --into NAME [--recipe FILE] [--from auto|kafka|ledger]
                    [--steps A:B] [--where SQL] [--rate N]
                    [--recompute-advantages ESTIMATOR] [--rescore FILE.py:Class]

Which rollouts: the ledger decides, always. `--steps` and `--where` become one
read-only query over the source run's training trajectories (alias `t`) joined with
their evaluations (alias `e`), so `--where "e.reward > 0 and t.num_tokens < 64"` picks
exactly the rows the same condition picks in `streamrl sql`.

Where the payloads come from: the source run's Kafka topics while they still hold them
(`--from kafka`), else the ledger (`--from ledger`); `auto` takes what Kafka still has
and the rest from the ledger, and says how many came from each.

What the new run sees: the selected groups, in the source's order, packed into steps of
`trajectory_pool.batch_size` groups (a trailing partial step is left out: the learner
trains whole steps). Each replayed trajectory keeps its id, tokens, behaviour logprobs
and the weight version that generated it, and names the source event it copies
(`source_event_id`). Its evaluation is the recorded one, or a fresh one from `--rescore`.
The new run's stream processor recomputes advantages (with `--recompute-advantages`, by
another estimator) and its learner trains with the recipe's off-policy correction.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from streamrl.algos.advantages import get_advantage_estimator
from streamrl.algos.losses import POLICY_LOSSES
from streamrl.producers.evaluator import BaseEvaluationTarget, Evaluator, run_evaluator
from streamrl.producers.evaluator_builtins import make_evaluator
from streamrl.runtime.bus import EventPublisher, RunReader
from streamrl.runtime.config import Recipe, Replay, ReplaySource
from streamrl.runtime.db import connect
from streamrl.runtime.plugins import load_module
from streamrl.runtime.settings import Settings
from streamrl.runtime.sql import run_readonly
from streamrl.schema.events import Evaluation, Trajectory
from streamrl.schema.ledger import query_events


class ReplayError(ValueError):
    """The replay cannot start: a bad option, an unknown run, nothing selected."""


@dataclass
class Plan:
    """Which source trajectories go into which step of the new run."""

    steps: int
    step_of: dict[str, int] = field(default_factory=dict)  # trajectory id -> new step
    group_size_of: dict[str, int] = field(default_factory=dict)  # group id -> selected members
    order: list[str] = field(default_factory=list)  # trajectory ids, in publishing order
    left_out_groups: int = 0


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """ "A:B" (inclusive), "A:" or ":B"."""
    if not text:
        return None
    first, sep, last = text.partition(":")
    try:
        low = int(first) if first else 1
        high = int(last) if last else 2**31 - 1
    except ValueError:
        raise ReplayError(f"--steps: expected A:B with whole numbers, got {text!r}") from None
    if not sep or low > high:
        raise ReplayError(f"--steps: expected A:B with A <= B, got {text!r}")
    return low, high


def selection_query(steps: tuple[int, int] | None, where: str | None) -> str:
    query = (
        "select t.trajectory_id, t.group_id from trajectories t "
        "left join evaluations e on e.run_id = t.run_id and e.trajectory_id = t.trajectory_id "
        "where t.run_id = %(source)s and not t.is_val"
    )
    if steps:
        query += " and t.step between %(first_step)s and %(last_step)s"
    if where:
        query += f" and ({where})"
    return query + " order by t.step, t.group_id, t.sample_index, t.trajectory_id"


def select_rollouts(
    database_url: str, source_run: str, steps: tuple[int, int] | None, where: str | None
) -> list[tuple[str, str]]:
    """(trajectory id, group id) of the selected rollouts, in the source's order. Runs as
    a read-only statement: a `--where` cannot change the ledger."""
    params: dict[str, Any] = {"source": source_run}
    if steps:
        params.update(first_step=steps[0], last_step=steps[1])
    result = run_readonly(database_url, selection_query(steps, where), params)
    return [(row[0], row[1]) for row in result.rows]


def plan_steps(selected: list[tuple[str, str]], groups_per_step: int) -> Plan:
    """Groups in order of first appearance, `groups_per_step` to a step. Pure."""
    members: dict[str, list[str]] = {}
    for trajectory_id, group_id in selected:
        members.setdefault(group_id, []).append(trajectory_id)
    groups = list(members)
    steps = len(groups) // groups_per_step
    plan = Plan(steps=steps, left_out_groups=len(groups) - steps * groups_per_step)
    for index, group_id in enumerate(groups[: steps * groups_per_step]):
        plan.group_size_of[group_id] = len(members[group_id])
        for trajectory_id in members[group_id]:
            plan.step_of[trajectory_id] = 1 + index // groups_per_step
            plan.order.append(trajectory_id)
    return plan


def replayed_trajectory(source: Trajectory, run_id: str, step: int, group_size: int) -> Trajectory:
    """The source trajectory in the new run: same tokens, logprobs and generating weight
    version; a new event (its id derives from the new run) that names its source."""
    copied = {
        name: getattr(source, name)
        for name in source.__struct_fields__
        if name not in ("run_id", "event_id", "schema_version", "created_at", "step", "group_size", "source_event_id")
    }
    return Trajectory(**copied, run_id=run_id, step=step, group_size=group_size, source_event_id=source.event_id)


def replayed_evaluation(source: Evaluation, run_id: str, step: int) -> Evaluation:
    copied = {
        name: getattr(source, name)
        for name in source.__struct_fields__
        if name not in ("run_id", "event_id", "schema_version", "created_at", "step", "source_event_id")
    }
    return Evaluation(**copied, run_id=run_id, step=step, source_event_id=source.event_id)


def rescored_evaluation(
    evaluator: Evaluator, evaluator_name: str, trajectory: Trajectory, task_data: dict, run_id: str, step: int
) -> Evaluation:
    outcome = run_evaluator(evaluator, task_data, BaseEvaluationTarget(final_answer=trajectory.response_text))
    result = outcome.result
    return Evaluation(
        run_id=run_id,
        trajectory_id=trajectory.trajectory_id,
        task_id=trajectory.task_id,
        group_id=trajectory.group_id,
        reward=result.reward,
        metrics=result.metrics,
        ground_truth=result.ground_truth,
        extra_info=result.extra_info,
        evaluator=evaluator_name,
        step=step,
        error=outcome.error,
    )


# --- reading the source -----------------------------------------------------------------------


def read_from_kafka(
    settings: Settings, source_run: str, wanted: set[str], idle_s: float = 3.0
) -> tuple[dict[str, Trajectory], dict[str, Evaluation]]:
    """What the source's topics still hold of the wanted rollouts: a scan from the start,
    ending when all are found or nothing new arrives for `idle_s`."""
    trajectories: dict[str, Trajectory] = {}
    evaluations: dict[str, Evaluation] = {}
    try:
        reader = RunReader(settings, source_run, ["trajectories", "evaluations"], group_id=None, stage="replay", wait_s=5.0)
    except Exception:  # the topics are gone (a broker restart): the ledger has everything
        return trajectories, evaluations
    last_new = time.monotonic()
    try:
        while time.monotonic() - last_new < idle_s and (len(trajectories) < len(wanted) or len(evaluations) < len(wanted)):
            events, _ = reader.poll(timeout_ms=200, max_records=5000)
            if events:
                last_new = time.monotonic()
            for event, _, _ in events:
                if isinstance(event, Trajectory) and event.trajectory_id in wanted:
                    trajectories[event.trajectory_id] = event
                elif isinstance(event, Evaluation) and event.trajectory_id in wanted:
                    evaluations[event.trajectory_id] = event
    finally:
        reader.close()
    return trajectories, evaluations


def read_from_ledger(database_url: str, source_run: str, ids: list[str]) -> tuple[dict[str, Trajectory], dict[str, Evaluation]]:
    trajectories: dict[str, Trajectory] = {}
    evaluations: dict[str, Evaluation] = {}
    if not ids:
        return trajectories, evaluations
    with connect(database_url, autocommit=True) as conn:
        for event in query_events(
            conn, Trajectory, "select * from trajectories where run_id = %s and trajectory_id = any(%s)", (source_run, ids)
        ):
            trajectories[event.trajectory_id] = event
        for evaluation in query_events(
            conn,
            Evaluation,
            "select * from evaluations where run_id = %s and trajectory_id = any(%s) and not is_val",
            (source_run, ids),
        ):
            evaluations[evaluation.trajectory_id] = evaluation
    return trajectories, evaluations


def task_data(database_url: str, source_run: str, task_ids: list[str]) -> dict[str, dict]:
    with connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "select task_id, data from tasks where run_id = %s and task_id = any(%s)", (source_run, task_ids)
        ).fetchall()
    return {task_id: data or {} for task_id, data in rows}


def load_rollouts(
    settings: Settings, source_run: str, ids: list[str], source: str
) -> tuple[dict[str, Trajectory], dict[str, Evaluation], dict[str, int]]:
    """The wanted rollouts' trajectory and evaluation events, and how many came from where."""
    source = ReplaySource(source).value
    trajectories: dict[str, Trajectory] = {}
    evaluations: dict[str, Evaluation] = {}
    if source in ("auto", "kafka"):
        trajectories, evaluations = read_from_kafka(settings, source_run, set(ids))
    from_kafka = sum(1 for i in ids if i in trajectories and i in evaluations)
    missing = [i for i in ids if i not in trajectories or i not in evaluations]
    if missing and source == "kafka":
        raise ReplayError(
            f"--from kafka: the source topics no longer hold {len(missing)} of the {len(ids)} selected "
            f"rollouts (e.g. {missing[0]}); use --from ledger or --from auto"
        )
    if missing:
        more_t, more_e = read_from_ledger(settings.database_url, source_run, missing)
        trajectories.update(more_t)
        evaluations.update(more_e)
    lost = [i for i in ids if i not in trajectories or i not in evaluations]
    if lost:
        raise ReplayError(f"{len(lost)} selected rollouts have no trajectory or evaluation in the ledger (e.g. {lost[0]})")
    return trajectories, evaluations, {"kafka": from_kafka, "ledger": len(ids) - from_kafka}


def replay_config(
    source_config: Recipe,
    recipe: Recipe | None,
    *,
    source_run: str,
    plan: Plan,
    source: str,
    steps: str | None,
    where: str | None,
    correction: str | None,
    recompute_advantages: str | None,
    rescore: str | None,
    rate: float | None,
) -> Recipe:
    """The new run's typed config: the recipe (or the source's), trained off-policy for
    the planned steps, with a `replay` section saying where its data came from."""
    config = copy.deepcopy(recipe or source_config)
    # the recorded prompts were rendered on the source's date: a new recipe renders them the same way
    config.data.template_date = source_config.data.template_date or config.data.template_date
    algorithm = config.algorithm
    # Every replayed sample is off-policy: a policy loss with a correction, never "none".
    chosen = correction or (algorithm.policy_loss if algorithm.policy_loss != "none" else "truncated_is")
    if chosen not in POLICY_LOSSES or chosen == "none":
        corrections = [name for name in POLICY_LOSSES.names() if name != "none"]
        raise ReplayError(f"--correction: expected one of {', '.join(corrections)}, got {chosen!r}")
    algorithm.policy_loss = chosen
    if recompute_advantages:
        if algorithm.custom_advantage_module_path:
            load_module(algorithm.custom_advantage_module_path)  # registers the recipe's own estimators
        try:
            get_advantage_estimator(recompute_advantages)
        except KeyError as exc:
            raise ReplayError(f"--recompute-advantages: {exc}") from None
        algorithm.type = recompute_advantages
    if rescore:
        config.rollout_worker.evaluator_module_path = rescore
    config.trainer.total_train_steps, config.trainer.total_epochs = plan.steps, None
    if recipe is None:  # the source's topic windows fitted the source's processes; the new run resolves its own
        config.service.broker.window_steps = "auto"
    config.replay = Replay(
        parent_run=source_run,
        source=source,
        steps=steps,
        where=where,
        recompute_advantages=recompute_advantages,
        rescore=rescore,
        rate=rate,
        train_steps=plan.steps,
        groups=len(plan.group_size_of),
        trajectories=len(plan.order),
        left_out_groups=plan.left_out_groups,
    )
    return config


def publish_replay(
    settings: Settings,
    run_id: str,
    plan: Plan,
    trajectories: dict[str, Trajectory],
    evaluations: dict[str, Evaluation],
    rescorer: tuple[Evaluator, str, dict[str, dict]] | None = None,
    rate: float | None = None,
    on_progress=None,
) -> int:
    """Publish the plan's rollouts into `run_id`, at most `rate` rollouts a second."""
    publisher = EventPublisher(settings, stage="replay", paced=True)  # the run's rollouts start here
    started = time.monotonic()
    try:
        for count, trajectory_id in enumerate(plan.order, start=1):
            source = trajectories[trajectory_id]
            step = plan.step_of[trajectory_id]
            trajectory = replayed_trajectory(source, run_id, step, plan.group_size_of[source.group_id])
            if rescorer:
                evaluator, name, data = rescorer
                evaluation = rescored_evaluation(evaluator, name, trajectory, data.get(source.task_id, {}), run_id, step)
            else:
                evaluation = replayed_evaluation(evaluations[trajectory_id], run_id, step)
            publisher.publish(trajectory)
            publisher.publish(evaluation)
            if rate:
                ahead = count / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            if on_progress and count % 256 == 0:
                on_progress(count)
        publisher.flush()
    finally:
        publisher.close()
    if on_progress:
        on_progress(len(plan.order))
    return len(plan.order)


def make_rescorer(spec: str) -> Evaluator:
    try:
        return make_evaluator(spec)
    except Exception as exc:
        raise ReplayError(f"--rescore: {exc}") from None
