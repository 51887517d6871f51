import pytest

from schema.events import Evaluation, TrainStep
from schema.topics import TopicNameError, event_key, parse_topic, run_topics, topic_name


def test_topic_names_round_trip():
    assert topic_name("run-1", "trajectories") == "streamrl.run-1.trajectories"
    assert parse_topic("streamrl.run-1.trajectories") == ("run-1", "trajectories")
    assert parse_topic("streamrl.run-1.unknown_kind") is None
    assert parse_topic("other.topic") is None
    assert set(run_topics("r")) == {"tasks", "trajectories", "evaluations", "samples", "steps", "weights",
                                    "runs", "dead_letters"}


@pytest.mark.parametrize("bad", ["", "has.dot", "space here", "-leading", "x" * 201, "ünï"])
def test_bad_run_ids_are_refused_with_the_rule(bad):
    with pytest.raises(TopicNameError, match="run id .* is not valid"):
        topic_name(bad, "tasks")


def test_unknown_kind_is_refused():
    with pytest.raises(TopicNameError, match="unknown topic kind 'task'"):
        topic_name("r", "task")


def test_group_events_share_a_key_and_run_events_use_the_run():
    evaluation = Evaluation(run_id="r", trajectory_id="t", group_id="g7", reward=1.0)
    assert event_key(evaluation) == b"g7"
    assert event_key(TrainStep(run_id="r", step=1)) == b"r"
