"""The topic topology, declared once: every kind of run topic, the event types it
carries, its partition key, and which stages write and read it.

A stage is one job of one process kind; `STAGE_FOLDERS` says which layer folder holds
its code. Readers (`runtime.bus.RunReader(stage=...)`) and writers
(`runtime.bus.EventPublisher(stage=...)`) name their stage and are refused a topic the
topology does not give them; `tests/test_topology.py` checks every call site, and the
README's topic table is `render_table()`'s output (also checked).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streamrl.schema.events import (
    DeadLetter,
    Evaluation,
    Event,
    GroupFiltered,
    RunEvent,
    Sample,
    Task,
    TrainStep,
    Trajectory,
    WeightVersion,
)

# stage -> the folder its code lives in
STAGE_FOLDERS: dict[str, str] = {
    "app": "streamrl",  # the CLI: creating runs, orchestration
    "recovery": "streamrl",  # `streamrl run --resume`: the ledger's records back onto a new topic set
    "demo": "streamrl",  # `streamrl demo`: synthetic events of every kind
    "publisher": "producers",
    "worker": "producers",
    "replay": "producers",  # re-publishing a recorded run's rollouts into a new run
    "processor": "consumers",
    "sink": "consumers",
    "tracker": "consumers",
    "learner": "learner",
    "config": "runtime",  # every process reads its run's recipe from the created event
}

EVERY_STAGE = tuple(STAGE_FOLDERS)


@dataclass(frozen=True)
class Topic:
    kind: str  # the topic is `streamrl.<run_id>.<kind>`
    events: tuple[type[Event], ...]
    key: str  # what the partition key is (schema.topics.event_key)
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    purpose: str


TOPOLOGY: dict[str, Topic] = {
    topic.kind: topic
    for topic in (
        Topic(
            "tasks",
            (Task,),
            "group id",
            ("publisher", "demo"),
            ("worker", "sink"),
            "a step's prompts, one task per sample, a group's tasks in one record",
        ),
        Topic(
            "trajectories",
            (Trajectory,),
            "group id",
            ("worker", "replay", "recovery", "demo"),
            ("processor", "sink", "replay"),
            "finished rollouts: exact tokens, loss mask, behaviour logprobs",
        ),
        Topic(
            "evaluations",
            (Evaluation,),
            "group id",
            ("worker", "replay", "recovery", "demo"),
            ("processor", "tracker", "sink", "replay"),
            "each rollout's reward and metrics (validation included)",
        ),
        Topic(
            "samples",
            (Sample, GroupFiltered),
            "group id",
            ("processor", "recovery", "demo"),
            ("learner", "sink"),
            "what the learner trains on, and the groups that give none (and why)",
        ),
        Topic(
            "steps",
            (TrainStep,),
            "run id",
            ("learner", "demo"),
            ("tracker", "sink", "learner"),
            "one record per optimizer step: loss, metrics, the samples it trained (a restarted learner re-trains "
            "those after its snapshot)",
        ),
        Topic(
            "weights",
            (WeightVersion,),
            "run id",
            ("learner", "demo"),
            ("worker", "publisher", "sink"),
            "each weight version the learner publishes",
        ),
        Topic(
            "runs",
            (RunEvent,),
            "run id",
            ("app", "publisher", "learner", "worker", "replay", "recovery", "demo"),
            ("config", "processor", "learner", "sink"),
            "the run's life: created (with its recipe), started, resumed, finished, failed",
        ),
        Topic(
            "dead_letters",
            (DeadLetter,),
            "run id",
            EVERY_STAGE,
            ("sink",),
            "records a reader could not decode, kept whole with where they came from",
        ),
    )
}


class TopologyError(ValueError):
    pass


def check_reads(stage: str, kinds: Iterable[str]) -> None:
    """Refuse a reader of a topic its stage does not read."""
    for kind in kinds:
        topic = TOPOLOGY.get(kind)
        if topic is None or stage not in topic.readers:
            raise TopologyError(f"stage {stage!r} does not read the {kind!r} topic (schema/topology.py)")


def check_writes(stage: str, event: Event) -> None:
    """Refuse an event its stage does not write, or one on a topic not declared for its type."""
    topic = TOPOLOGY.get(event.KIND)
    if topic is None or type(event) not in topic.events:
        raise TopologyError(f"{type(event).__name__} is not declared on the {event.KIND!r} topic")
    if stage not in topic.writers:
        raise TopologyError(f"stage {stage!r} does not write the {event.KIND!r} topic (schema/topology.py)")


def render_table() -> str:
    """The topology as the Markdown table the README shows."""
    lines = ["| topic `streamrl.<run>.…` | events | key | written by | read by |", "|---|---|---|---|---|"]
    for topic in TOPOLOGY.values():
        events = ", ".join(event.__name__ for event in topic.events)
        writers = "every reader" if topic.writers == EVERY_STAGE else ", ".join(topic.writers)
        lines.append(f"| `{topic.kind}` | {events} | {topic.key} | {writers} | {', '.join(topic.readers)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_table())
