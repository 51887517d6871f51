"""`streamrl run --resume RUN`: finish a run after its processes died, and after the
embedded broker lost everything it held (it keeps topics in memory).

The ledger is the durable record, so it is where a run is rebuilt from:

1. If the run's topics are gone, they are made again, the run's `created` event (its
   resolved config) is re-published, and the ledger sink's saved positions for those
   topics are cleared (they count offsets of topics that no longer exist).
2. Every training group the learner still needs is re-published from the ledger in the
   furthest-along form the ledger holds: its GroupFiltered record, else its complete set
   of samples, else its trajectories and evaluations (for the stream processor to join
   again). Groups of steps the learner has checkpointed are only re-published when they
   never reached a sample (their samples would be skipped).
3. The publisher re-publishes, paced as usual, only the tasks with no trajectory and
   evaluation in the ledger; the workers do those again.

Every re-published event keeps its event id, so the ledger stores each fact once. What
the broker held and the sink had not yet written (its lag, well under a second) is
redone by the workers rather than recovered. A validation of an earlier version redone
this way runs on newer weights, and its trajectories say so (`weight_version`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka import TopicPartition

from streamrl.runtime.bus import EventPublisher, make_consumer
from streamrl.runtime.config import Recipe
from streamrl.runtime.db import connect
from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.runtime.topic_retention import delete_run_topics, topic_configs
from streamrl.schema.events import Evaluation, Event, GroupFiltered, RunEvent, Sample, Trajectory
from streamrl.schema.ledger import query_events
from streamrl.schema.topics import run_pattern, set_window_steps, topic_name


@dataclass
class Rebuilt:
    topics_recreated: bool = False
    groups: dict[str, int] = field(default_factory=dict)  # how each group was re-published
    events: int = 0


CREATED_EVENT_WAIT_S = 10.0  # a runs topic is small: read whole well within this

# whole samples: a sample stored once keeps its arrays in its trajectory's row (migration 0020)
SAMPLES_OF_GROUPS = "select * from samples_with_arrays where run_id = %s and group_id = any(%s)"


def run_topics_intact(settings: Settings, run_id: str) -> bool:
    """Whether the broker still holds the run's topics with their events: its runs topic
    exists and begins with the run's `created` event. One made again after the broker
    lost it (by something else, or by a broker that makes a topic on the first write to
    it) may hold events written since, a process's failure say, but never that one: it
    is rebuilt like a lost one."""
    from streamrl.runtime.runs import RunNotFound, fetch_run_config

    consumer = make_consumer(settings, None)
    try:
        runs = topic_name(run_id, "runs")
        if runs not in consumer.topics():
            return False
        partitions = [TopicPartition(runs, p) for p in consumer.partitions_for_topic(runs) or ()]
        if sum(consumer.end_offsets(partitions).values()) == 0:
            return False
    finally:
        consumer.close()
    try:
        fetch_run_config(settings, run_id, timeout_s=CREATED_EVENT_WAIT_S)
    except RunNotFound:
        return False
    return True


def group_plan(
    filtered: set[str], sample_counts: dict[str, tuple[int, int]], rollout_groups: dict[str, int], trained_step: int
) -> dict[str, str]:
    """For each training group in the ledger, what to re-publish: 'filtered', 'samples',
    'rollouts', or nothing (left out). Pure.

    `sample_counts`: group -> (samples in the ledger, the group's sample count);
    `rollout_groups`: group -> its step."""
    plan = {}
    for group_id, step in rollout_groups.items():
        needed = step > trained_step
        if group_id in filtered:
            if needed:
                plan[group_id] = "filtered"
        elif group_id in sample_counts and sample_counts[group_id][0] >= sample_counts[group_id][1]:
            if needed:
                plan[group_id] = "samples"
        else:
            plan[group_id] = "rollouts"
    return plan


def rebuild_from_ledger(settings: Settings, run_id: str, trained_step: int) -> Rebuilt:
    """Re-create what the broker lost of `run_id`; `trained_step` is the learner's last
    checkpointed step."""
    rebuilt = Rebuilt()
    url = settings.database_url
    with connect(url, autocommit=True) as conn:
        created = query_events(conn, RunEvent, "select * from run_events where run_id = %s and kind = 'created'", (run_id,))
        if not created:
            raise LookupError(f"run {run_id!r} has no 'created' event in the ledger")
        broker = Recipe.recorded(created[0].config).service.broker
        set_window_steps(run_id, broker.resolved_windows())
        if not run_topics_intact(settings, run_id):
            delete_run_topics(settings, run_id)
            create_run_topics(settings, run_id, configs=topic_configs(broker, settings))
            conn.execute("delete from consumer_offsets where topic ~ %s", (run_pattern(run_id),))  # windows too
            rebuilt.topics_recreated = True
        filtered = {
            r[0] for r in conn.execute("select group_id from filtered_groups where run_id = %s and reason <> 'late'", (run_id,))
        }
        sample_counts = {
            g: (int(n), int(size))
            for g, n, size in conn.execute(
                "select group_id, count(*), max(group_size) from samples where run_id = %s group by group_id", (run_id,)
            )
        }
        rollout_groups = {
            g: s
            for g, s in conn.execute(
                "select group_id, min(step) from trajectories where run_id = %s and not is_val group by group_id", (run_id,)
            )
        }
        plan = group_plan(filtered, sample_counts, rollout_groups, trained_step)
        chosen = {kind: [g for g, k in plan.items() if k == kind] for kind in ("filtered", "samples", "rollouts")}
        with EventPublisher(settings, stage="recovery") as publisher:
            publisher.publish(created[0])
            batches: list[tuple[type[Event], str, list[str]]] = [
                (
                    GroupFiltered,
                    "select * from filtered_groups where run_id = %s and group_id = any(%s) and reason <> 'late'",
                    chosen["filtered"],
                ),
                (Sample, SAMPLES_OF_GROUPS, chosen["samples"]),
                (
                    Trajectory,
                    "select t.* from trajectories t join evaluations e on e.run_id = t.run_id "
                    "and e.trajectory_id = t.trajectory_id where t.run_id = %s and t.group_id = any(%s)",
                    chosen["rollouts"],
                ),
                (
                    Evaluation,
                    "select e.* from evaluations e join trajectories t on t.run_id = e.run_id "
                    "and t.trajectory_id = e.trajectory_id where e.run_id = %s and e.group_id = any(%s) "
                    "and not e.is_val",
                    chosen["rollouts"],
                ),
            ]
            for event_type, query, groups in batches:
                if not groups:
                    continue
                for event in query_events(conn, event_type, query, (run_id, groups)):
                    publisher.publish(event)
                    rebuilt.events += 1
            publisher.flush()
        rebuilt.groups = {kind: len(groups) for kind, groups in chosen.items()}
    return rebuilt


def finished_task_ids(database_url: str, run_id: str) -> set[str]:
    """Tasks whose rollout and evaluation are both in the ledger: not to be done again."""
    with connect(database_url, autocommit=True) as conn:
        return {
            r[0]
            for r in conn.execute(
                "select t.task_id from trajectories t join evaluations e on e.run_id = t.run_id "
                "and e.trajectory_id = t.trajectory_id where t.run_id = %s",
                (run_id,),
            )
        }


@dataclass
class Resume:
    recipe: Recipe
    trained_step: int
    rebuilt: Rebuilt
    partition_assignment: str | None = None  # as the run was started (None: not recorded)

    def describe(self, run_id: str) -> str:
        what = (
            f"topics re-created; re-published {self.rebuilt.events} events from the ledger ({self.rebuilt.groups})"
            if self.rebuilt.topics_recreated
            else "the broker still holds the run's topics"
        )
        return f"resuming {run_id} after step {self.trained_step}: {what}"


def prepare_resume(settings: Settings, run_id: str) -> Resume:
    """`streamrl run --resume RUN`: the recorded config, the learner's last checkpointed
    step, and what the broker lost rebuilt from the ledger."""
    from streamrl.learner.checkpoint import latest_checkpoint, load_state
    from streamrl.learner.loop import run_dir

    with connect(settings.database_url, autocommit=True) as conn:
        row = conn.execute("select config, details from run_events where run_id = %s and kind = 'created'", (run_id,)).fetchone()
    if row is None:
        raise LookupError(f"--resume: run {run_id!r} is not in the ledger")
    recipe = Recipe.recorded(row[0])
    checkpoint = latest_checkpoint(run_dir(settings, run_id, recipe.trainer.checkpoint_path))
    trained = load_state(checkpoint)["step"] if checkpoint else 0
    return Resume(recipe, trained, rebuild_from_ledger(settings, run_id, trained), (row[1] or {}).get("partition_assignment"))
