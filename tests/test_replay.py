"""Replay, lineage and SQL over a recorded run, on the real embedded broker and
PostgreSQL: one source run of the built-in recipe (60 steps of 32 groups x 8 rollouts),
then replays of it and questions to the ledger whose answers the run's shape fixes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, run_cli
from tests.helpers.learning import assert_learned
from tests.helpers.warm_model import warm_model_folder

RECIPE = str(REPO / "recipes" / "arith" / "recipe.yaml")
STEPS, GROUPS, GROUP_SIZE = 60, 32, 8
# The source run starts from the committed warmed model (tests/data/arith_warm, held-out
# 0.695) in sync mode: the same rollouts on every machine, so the replay's gain is too.
SOURCE_ENV = {
    "ARITH_STEPS": str(STEPS),
    "ARITH_WARMUP_STEPS": "0",
    "ARITH_VALIDATE_EVERY": str(STEPS),
    "ARITH_SYNC_MODE": "sync",
}


def rows(conn, query, *params):
    return conn.execute(query, params).fetchall()


@pytest.fixture(scope="module")
def source_run(stack, tmp_path_factory):
    run_id = "replay-source"
    model = warm_model_folder(tmp_path_factory.mktemp("model"))
    # its topics stay on the broker (a finished run's are removed by default) for the Kafka-side replay
    result = run_cli(
        "run",
        RECIPE,
        f"rollout_worker.model_path={model}",
        "service.broker.retention=keep",
        "--run",
        run_id,
        "--out",
        str(tmp_path_factory.mktemp("source")),
        env=SOURCE_ENV,
        timeout=420,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "topics from the broker" not in result.stdout
    return run_id


@pytest.mark.learning
def test_replay_with_the_same_estimator_reproduces_advantages_and_retrains_a_fresh_model(source_run, ledger, tmp_path):
    into = "replay-same"
    result = run_cli("replay", source_run, "--into", into, "--from", "kafka", "--out", str(tmp_path), timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"kafka: {STEPS * GROUPS * GROUP_SIZE}, ledger: 0" in " ".join(result.stdout.split())

    # the same groups give the same advantages, sample for sample
    source = dict(rows(ledger, "select trajectory_id, advantage from samples where run_id = %s", source_run))
    replayed = dict(rows(ledger, "select trajectory_id, advantage from samples where run_id = %s", into))
    assert len(replayed) == len(source) > 0
    assert replayed == source
    # every replayed event names the event it copies; the run names its parent
    unmatched = rows(
        ledger,
        """
        select count(*) from trajectories r left join trajectories s
          on s.run_id = %s and s.event_id = r.source_event_id and s.trajectory_id = r.trajectory_id
             and s.weight_version = r.weight_version and s.logprobs = r.logprobs
        where r.run_id = %s and s.event_id is null""",
        source_run,
        into,
    )[0][0]
    assert unmatched == 0
    assert (
        rows(ledger, "select count(*) from evaluations where run_id = %s and source_event_id is not null", into)[0][0]
        == STEPS * GROUPS * GROUP_SIZE
    )
    parent, config = rows(ledger, "select parent_run_id, config from run_events where run_id = %s and kind = 'created'", into)[0]
    assert parent == source_run
    assert config["replay"]["train_steps"] == STEPS and config["algorithm"]["policy_loss"] == "truncated_is"
    assert [r[0] for r in rows(ledger, "select step from train_steps where run_id = %s order by step", into)] == list(
        range(1, STEPS + 1)
    )

    # off-policy retraining works: the fresh model (the warmed model the source run started
    # from) trained on the replayed rollouts answers more of the 200 held-out prompts right,
    # by three standard errors of that gain or more
    details = rows(ledger, "select details from run_events where run_id = %s and kind = 'finished' and name = 'learner'", into)[
        0
    ][0]
    before, after = details_before(ledger, into), details["val_accuracy_after_replay"]
    assert_learned(before, after, 200, "held-out accuracy after retraining on the replayed rollouts")


def details_before(ledger, run_id):
    return rows(ledger, "select details from run_events where run_id = %s and kind = 'started' and name = 'learner'", run_id)[0][
        0
    ]["val_accuracy_before_replay"]


def test_replay_where_selects_the_sql_rows_and_recomputes_advantages(source_run, ledger, tmp_path):
    into = "replay-where"
    where = "(e.reward > 0 or t.sample_index < 5) and t.step <= 4"
    env = {**SOURCE_ENV, "ARITH_WARMUP_STEPS": "0"}
    result = run_cli(
        "replay",
        source_run,
        "--into",
        into,
        "--from",
        "ledger",
        "--where",
        where,
        "--recompute-advantages",
        "dr_grpo",
        "--recipe",
        RECIPE,
        "--out",
        str(tmp_path),
        env=env,
        timeout=420,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    expected = {
        r[0]
        for r in rows(
            ledger,
            f"""
        select t.trajectory_id from trajectories t
        join evaluations e on e.run_id = t.run_id and e.trajectory_id = t.trajectory_id
        where t.run_id = %s and not t.is_val and {where}""",
            source_run,
        )
    }
    replayed = {r[0] for r in rows(ledger, "select trajectory_id from trajectories where run_id = %s", into)}
    assert replayed == expected and len(expected) > 4 * GROUPS * 5 - 1

    # Dr. GRPO: advantage = reward - the mean reward of the replayed group (no std scaling)
    samples = rows(ledger, "select group_id, reward, advantage, estimator from samples where run_id = %s", into)
    assert samples and {s[3] for s in samples} == {"dr_grpo"}
    by_group: dict[str, list] = {}
    for group_id, reward, advantage, _ in samples:
        by_group.setdefault(group_id, []).append((reward, advantage))
    for members in by_group.values():
        rewards = np.array([m[0] for m in members])
        np.testing.assert_allclose([m[1] for m in members], rewards - rewards.mean(), atol=1e-9)


def test_replay_refuses_bad_options(source_run, ledger):
    result = run_cli("replay", source_run, "--into", "replay-bad", "--where", "no_such_column > 1")
    assert result.returncode == 2 and "--where" in result.stderr
    result = run_cli("replay", source_run, "--into", "replay-bad", "--where", "true; delete from tasks")
    assert result.returncode == 2
    result = run_cli("replay", source_run, "--into", "replay-bad", "--recompute-advantages", "nope")
    assert result.returncode == 2 and "unknown advantage estimator" in result.stderr
    result = run_cli("replay", "no-such-run", "--into", "replay-bad")
    assert result.returncode == 2 and "not in the ledger" in result.stderr
    assert rows(ledger, "select count(*) from tasks where run_id = %s", source_run)[0][0] > 0


def test_views_and_lineage_on_a_run_of_known_shape(source_run, ledger):
    run = source_run
    by_step = rows(ledger, "select step, rollouts from reward_by_step where run_id = %s order by step", run)
    assert by_step == [(s, GROUPS * GROUP_SIZE) for s in range(1, STEPS + 1)]
    # every training rollout is counted under the weight version that generated it
    assert (
        sum(r[0] for r in rows(ledger, "select rollouts from reward_by_weight_version where run_id = %s and not is_val", run))
        == STEPS * GROUPS * GROUP_SIZE
    )
    groups = rows(ledger, "select outcome, count(*) from group_stats where run_id = %s group by outcome", run)
    outcomes = dict(groups)
    assert sum(outcomes.values()) == STEPS * GROUPS
    assert outcomes.get("trained", 0) == rows(ledger, "select count(distinct group_id) from samples where run_id = %s", run)[0][0]
    assert (
        outcomes.get("zero_variance", 0)
        == rows(ledger, "select count(*) from filtered_groups where run_id = %s and reason = 'zero_variance'", run)[0][0]
    )

    # weight version 5 -> the step that produced it -> its samples -> trajectories -> tasks
    trained = set(rows(ledger, "select sample_ids from train_steps where run_id = %s and step = 5", run)[0][0])
    lineage = rows(
        ledger,
        """select l.trajectory_id, l.generated_by_version, l.trained_in_step, tk.step
                              from lineage l join tasks tk on tk.run_id = l.run_id and tk.task_id = l.task_id
                              where l.run_id = %s and l.produced_version = 5""",
        run,
    )
    assert {r[0] for r in lineage} == trained and len(lineage) == len(trained) > 0
    assert {r[2] for r in lineage} == {5} and {r[3] for r in lineage} == {5}
    assert all(3 <= r[1] <= 4 for r in lineage)  # staleness 1: generated by version 3 or 4
    # ... and back: a trajectory -> the weight version (and files) that generated it
    trajectory_id, version = rows(
        ledger,
        "select trajectory_id, weight_version from trajectories where run_id = %s and not is_val and step = 9 limit 1",
        run,
    )[0]
    back = rows(
        ledger,
        "select generated_by_version, generated_by_weights from lineage where run_id = %s and trajectory_id = %s",
        run,
        trajectory_id,
    )
    uri = rows(ledger, "select uri from weight_versions where run_id = %s and version = %s", run, version)[0][0]
    assert back == [(version, uri)]
    # staleness views account for every sample
    trained_total = rows(ledger, "select sum(samples) from train_steps where run_id = %s", run)[0][0]
    assert (
        rows(ledger, "select count(*) from sample_staleness where run_id = %s and status = 'trained'", run)[0][0] == trained_total
    )
    assert rows(ledger, "select sum(trained) from staleness_by_length where run_id = %s", run)[0][0] == trained_total
    assert rows(ledger, "select sum(trained) from staleness_by_prompt where run_id = %s", run)[0][0] == trained_total


def test_sql_file_params_and_outputs(source_run, tmp_path):
    query = tmp_path / "q.sql"
    query.write_text("select step, rollouts, reward_mean from reward_by_step where run_id = %(run)s order by step")
    as_json = run_cli("sql", "--file", str(query), "-p", f"run={source_run}", "--json", check=True)
    records = json.loads(as_json.stdout)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    parquet = tmp_path / "steps.parquet"
    run_cli("sql", "--file", str(query), "-p", f"run={source_run}", "--parquet", str(parquet), check=True)
    table = pq.read_table(parquet).to_pydict()
    assert table["step"] == list(range(1, STEPS + 1))
    assert table["reward_mean"] == pytest.approx([r["reward_mean"] for r in records])


def test_show_tells_the_story(source_run, tmp_path):
    result = run_cli("show", source_run, "--out", str(tmp_path), check=True)
    for section in ("config", "throughput", "staleness", "logprob gap", "filtered groups", "dead letters"):
        assert section in result.stdout
    html = (tmp_path / "report.html").read_text()
    assert "throughput" in html and html.count("data:image/png;base64,") == 2
    assert (tmp_path / "reward_curve.png").stat().st_size > 10_000
    assert (tmp_path / "logprob_gap.png").stat().st_size > 10_000


def test_rescore_re_evaluates_recorded_trajectories(source_run, ledger, tmp_path):
    evaluator = tmp_path / "sevens.py"
    evaluator.write_text(
        "from streamrl.api import EvaluationRunResult, Evaluator\n\n"
        "class Sevens(Evaluator):\n"
        "    def evaluate(self, data, evaluation_target):\n"
        "        return EvaluationRunResult(reward=float(evaluation_target.final_answer.strip() == '7'),\n"
        "                                   ground_truth=data['answer'])\n"
    )
    into = "replay-rescore"
    spec = f"{evaluator}:Sevens"
    result = run_cli(
        "replay",
        source_run,
        "--into",
        into,
        "--steps",
        "1:2",
        "--rescore",
        spec,
        "--recipe",
        RECIPE,
        "--out",
        str(tmp_path),
        env={**SOURCE_ENV, "ARITH_WARMUP_STEPS": "0"},
        timeout=420,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    scored = rows(
        ledger,
        """select t.response_text, e.reward, e.evaluator, e.source_event_id, e.ground_truth #>> '{}', tk.data->>'answer'
                             from evaluations e join trajectories t on t.run_id = e.run_id and t.trajectory_id = e.trajectory_id
                             join tasks tk on tk.run_id = %s and tk.task_id = t.task_id
                             where e.run_id = %s""",
        source_run,
        into,
    )
    assert len(scored) == 2 * GROUPS * GROUP_SIZE
    for response, reward, name, source_event, truth, answer in scored:
        assert reward == float(response.strip() == "7") and name == spec and source_event is None and truth == answer
    assert {r[1] for r in scored} == {0.0, 1.0}


def test_rescore_takes_the_same_evaluator_specs_as_a_recipe():
    from streamrl.producers.evaluator_builtins import ExactMatch
    from streamrl.producers.replay import ReplayError, make_rescorer

    assert isinstance(make_rescorer("builtin:exact_match"), ExactMatch)
    with pytest.raises(ReplayError, match=r"--rescore: .*no built-in evaluator 'nope'"):
        make_rescorer("builtin:nope")
