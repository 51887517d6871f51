import pytest

from streamrl.schema.events import Evaluation, TrainStep
from streamrl.schema.topics import TopicNameError, event_key, parse_topic, run_topics, topic_name


def test_topic_names_round_trip():
    assert topic_name("run-1", "trajectories") == "streamrl.run-1.trajectories"
    assert parse_topic("streamrl.run-1.trajectories") == ("run-1", "trajectories")
    assert parse_topic("streamrl.run-1.unknown_kind") is None
    assert parse_topic("other.topic") is None
    assert set(run_topics("r")) == {"tasks", "trajectories", "evaluations", "samples", "steps", "weights", "runs", "dead_letters"}


@pytest.mark.parametrize("bad", ["", "has.dot", "space here", "-leading", "x" * 201, "ünï"])
def test_bad_run_ids_are_refused_with_the_rule(bad):
    with pytest.raises(TopicNameError, match=r"run id .* is not valid"):
        topic_name(bad, "tasks")


def test_unknown_kind_is_refused():
    with pytest.raises(TopicNameError, match="unknown topic kind 'task'"):
        topic_name("r", "task")


def test_group_events_share_a_key_and_run_events_use_the_run():
    evaluation = Evaluation(run_id="r", trajectory_id="t", group_id="g7", reward=1.0)
    assert event_key(evaluation) == b"g7"
    assert event_key(TrainStep(run_id="r", step=1)) == b"r"


def test_a_rotating_runs_events_go_to_the_window_of_their_step():
    from streamrl.schema.events import Sample, WeightVersion
    from streamrl.schema.topics import set_window_steps, topic_for, topic_window, window_topic

    set_window_steps("rot", 5)
    try:
        # steps 0-4 are window 0, 5-9 window 1; run-level kinds keep their one topic
        assert topic_for(Sample(run_id="rot", trajectory_id="t", group_id="g", step=4)) == ("streamrl.rot.samples.w000000", 0)
        assert topic_for(TrainStep(run_id="rot", step=5)) == ("streamrl.rot.steps.w000001", 1)
        assert topic_for(WeightVersion(run_id="rot", version=7)) == ("streamrl.rot.weights", None)
        assert topic_for(TrainStep(run_id="other", step=5)) == ("streamrl.other.steps", None)
    finally:
        set_window_steps("rot", None)
    assert topic_for(TrainStep(run_id="rot", step=5)) == ("streamrl.rot.steps", None)
    assert parse_topic("streamrl.rot.samples.w000012") == ("rot", "samples")
    assert topic_window("streamrl.rot.samples.w000012") == 12 and topic_window("streamrl.rot.samples") is None
    assert parse_topic("streamrl.rot.weights.w000001") is None  # weights do not rotate
    with pytest.raises(TopicNameError, match="does not rotate"):
        window_topic("rot", "runs", 3)


def test_readers_hold_the_newest_four_windows_and_the_learner_those_it_has_not_trained():
    import re

    from streamrl.learner.recorded_steps import holds_untrained
    from streamrl.schema.topics import run_pattern, windows_to_hold

    listed = [
        "streamrl.r.samples",
        "streamrl.r2.samples.w000009",
        "streamrl.r.tasks.w000009",
        *[f"streamrl.r.samples.w{w:06d}" for w in range(8)],
    ]
    samples = re.compile(run_pattern("r", ["samples"]))
    assert windows_to_hold(listed, samples) == [f"streamrl.r.samples.w{w:06d}" for w in (4, 5, 6, 7)]
    # a learner that trained step 22 with windows of 5 steps still needs window 4 (steps 20-24)
    learner = windows_to_hold(listed, samples, lambda w, newest: holds_untrained(5, w, 22))
    assert learner == [f"streamrl.r.samples.w{w:06d}" for w in (4, 5, 6, 7)]
    assert holds_untrained(5, 4, 24) is False and holds_untrained(None, 0, 10**6) is True


def test_a_window_closes_when_the_snapshot_and_every_readers_hold_are_past_it():
    from streamrl.runtime.topic_windows import window_closed

    seen = {0, 1, 2, 3, 4}
    assert window_closed(0, 5, snapshot=4, windows_seen=seen)  # steps 0-4, window 4 made
    assert not window_closed(0, 5, snapshot=3, windows_seen=seen)  # step 4 not in a snapshot yet
    assert not window_closed(1, 5, snapshot=20, windows_seen=seen)  # readers still hold window 1
    assert not window_closed(0, 5, snapshot=None, windows_seen=seen)


def test_a_window_shorter_than_the_rollouts_lead_is_refused():
    from streamrl.runtime.service_config import Broker, window_problems

    assert window_problems(Broker(window_steps=3), staleness=1, save_freq=3) == []
    problems = window_problems(Broker(window_steps=2), staleness=1, save_freq=2)
    assert len(problems) == 1 and "window_steps: 2 is too short" in problems[0] and "at least 3" in problems[0]
    assert window_problems(Broker(), staleness=4, save_freq=100) == []  # auto: resolved when the run is created
    both = window_problems(Broker(window_steps=50, retention_ms=60_000), staleness=1, save_freq=10)
    assert len(both) == 1 and "not with retention_ms or retention_bytes" in both[0]


def test_a_window_shorter_than_the_snapshot_interval_is_refused():
    """The task publisher waits while the broker holds BROKER_WINDOWS of the run's
    windows, and a window leaves only once a snapshot is past it: a run that snapshots
    less than once a window would wait for ever."""
    from streamrl.runtime.service_config import Broker, window_problems
    from tests.conftest import run_cli

    assert window_problems(Broker(window_steps=10), staleness=1, save_freq=10) == []
    problems = window_problems(Broker(window_steps=9), staleness=1, save_freq=10)
    assert problems == [
        "service.broker.window_steps: 9 is shorter than trainer.save_freq (10): a window leaves the broker once a "
        "snapshot is past it, and the run waits when the broker holds 6 of its windows, so it must snapshot at "
        "least once a window; set window_steps to at least 10, or auto"
    ]
    result = run_cli(
        "recipe", "validate", "recipes/arith/recipe.yaml", "service.broker.window_steps=4", "trainer.save_freq=8", timeout=120
    )
    said = " ".join(result.stdout.split() + result.stderr.split())
    assert result.returncode != 0 and "service.broker.window_steps: 4 is shorter than trainer.save_freq (8)" in said, said


def test_a_runs_windows_are_read_from_the_topic_names_the_broker_lists():
    from streamrl.schema.topics import existing_run_topics, existing_run_windows, topic_name, window_topic

    listed = [
        topic_name("rot", "tasks"),
        window_topic("rot", "tasks", 3),
        window_topic("rot", "samples", 3),
        window_topic("rot", "steps", 12),
        window_topic("rot2", "tasks", 5),  # another run whose id starts the same
        "streamrl.other",
    ]
    assert existing_run_windows("rot", listed) == {3, 12}
    assert existing_run_topics("rot", listed) == sorted(listed[:4])
    assert existing_run_windows("rot2", listed) == {5}
