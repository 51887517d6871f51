"""The topic topology (schema/topology.py) against the code: every event type has one
topic, every reader and writer in the components names its stage, and what each stage
reads is declared; the README shows the table the topology renders."""

import ast
from pathlib import Path

import pytest

from streamrl.schema.events import EVENT_TYPES, DeadLetter, Sample, Trajectory
from streamrl.schema.topics import KINDS
from streamrl.schema.topology import STAGE_FOLDERS, TOPOLOGY, TopologyError, check_reads, check_writes, render_table

REPO = Path(__file__).resolve().parent.parent
CODE_FOLDERS = ("producers", "consumers", "learner", "training_service", "streamrl", "runtime")


def test_every_event_type_is_on_exactly_one_topic_of_its_kind():
    assert tuple(TOPOLOGY) == KINDS
    for event_type in EVENT_TYPES:
        homes = [topic.kind for topic in TOPOLOGY.values() if event_type in topic.events]
        assert homes == [event_type.KIND], event_type.__name__
    stages = {stage for topic in TOPOLOGY.values() for stage in topic.writers + topic.readers}
    assert stages <= set(STAGE_FOLDERS)


def call_sites(name: str):
    """Every call of `name(...)` in the project's code: (file, folder, call node)."""
    for folder in CODE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
                    yield path.relative_to(REPO), folder, node


def stage_of(node: ast.Call) -> str | None:
    for keyword in node.keywords:
        if keyword.arg == "stage" and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return None


@pytest.mark.parametrize("constructor", ["RunReader", "EventPublisher"])
def test_every_reader_and_writer_names_a_stage_of_its_own_folder(constructor):
    problems, seen = [], 0
    for path, folder, node in call_sites(constructor):
        seen += 1
        stage = stage_of(node)
        if stage is None:
            problems.append(f"{path}:{node.lineno}: {constructor} without a stage")
        elif STAGE_FOLDERS.get(stage) != folder:
            problems.append(f"{path}:{node.lineno}: stage {stage!r} is not a stage of {folder}/")
        elif constructor == "RunReader" and isinstance(node.args[2], (ast.List, ast.Tuple)):
            kinds = [element.value for element in node.args[2].elts]
            try:
                check_reads(stage, kinds)
            except TopologyError as exc:
                problems.append(f"{path}:{node.lineno}: {exc}")
    assert seen >= 6 and problems == []


def test_a_stage_is_refused_what_the_topology_does_not_give_it():
    with pytest.raises(TopologyError, match="stage 'worker' does not read the 'samples' topic"):
        check_reads("worker", ["samples"])
    sample = Sample(run_id="r", trajectory_id="t", group_id="g")
    check_writes("processor", sample)
    with pytest.raises(TopologyError, match="stage 'worker' does not write the 'samples' topic"):
        check_writes("worker", sample)
    check_writes("worker", Trajectory(run_id="r", trajectory_id="t", task_id="t", group_id="g"))
    check_writes("worker", DeadLetter(run_id="r", source_topic="x", source_partition=0, source_offset=0, error="e"))


def test_the_readme_shows_the_topology():
    assert render_table() in (REPO / "README.md").read_text()
