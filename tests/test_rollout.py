"""Rollout workers with the seed API, on the real embedded engine (events captured in a list)."""

import numpy as np
import pytest

from streamrl.producers.evaluator import ExactMatchEvaluator
from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams
from streamrl.producers.rollout import (
    BaseRolloutWorker,
    InferenceClient,
    SingleTurnWorker,
    Trajectory,
)
from streamrl.runtime.chat_template import encode
from streamrl.runtime.tiny_lm import build_tiny_model
from streamrl.schema.events import Evaluation, Task, unpack_float32, unpack_int32, unpack_mask
from streamrl.schema.events import Trajectory as TrajectoryEvent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = BatchingEngine(EmbeddedEngine(build_tiny_model(tmp_path_factory.mktemp("w") / "m", seed=2)))
    yield engine
    engine.close()


def make_worker(cls, server, published, **config):
    client = InferenceClient(server, SamplingParams(max_new_tokens=4))
    return cls({"temperature": 1.0, "max_tokens": 4, **config}, client, ExactMatchEvaluator(), published.append)


def task(min_weight_version=0):
    return Task(
        run_id="r", task_id="t1", group_id="g1", prompt="12+34=", data={"answer": "6"}, min_weight_version=min_weight_version
    )


def test_single_turn_worker_publishes_a_trajectory_and_its_evaluation(server):
    published = []
    trajectory, evaluation = make_worker(SingleTurnWorker, server, published).run_task(task())
    assert published == [trajectory, evaluation]
    assert isinstance(trajectory, TrajectoryEvent) and isinstance(evaluation, Evaluation)
    tokens, mask, logprobs = (
        unpack_int32(trajectory.tokens),
        unpack_mask(trajectory.loss_mask),
        unpack_float32(trajectory.logprobs),
    )
    # the built-in model's tokenizer has a ChatML template: the prompt is its user turn
    prompt = encode(server.tokenizer, "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n")
    assert list(tokens[: len(prompt)]) == prompt and trajectory.prompt_length == len(prompt)
    assert list(mask) == [0] * len(prompt) + [1] * (len(tokens) - len(prompt))
    assert np.all(logprobs[: len(prompt)] == 0) and np.all(logprobs[len(prompt) :] < 0)
    assert evaluation.reward in (0.0, 1.0) and evaluation.trajectory_id == trajectory.trajectory_id == "t1"


class TwoCallWorker(BaseRolloutWorker):
    """Two LLM calls merged into one trajectory, written like the guide (no logprobs passed)."""

    def rollout(self, task):
        first = self._inference_client.completion(task["prompt"], max_tokens=3)
        second = self._inference_client.completion(first["prompt_tokens"] + first["response_tokens"], max_tokens=3)
        tokens = second["prompt_tokens"] + second["response_tokens"]
        self.expected = [0.0] * len(first["prompt_tokens"]) + first["logprobs"] + second["logprobs"]
        return self._put_trajectory(
            Trajectory(
                tokens=tokens,
                loss_mask=[0] * len(first["prompt_tokens"]) + [1] * (len(tokens) - len(first["prompt_tokens"])),
                reward=0.5,
            )
        )


def test_behaviour_logprobs_are_recovered_across_calls(server):
    published = []
    worker = make_worker(TwoCallWorker, server, published)
    trajectory, evaluation = worker.run_task(task())
    assert unpack_float32(trajectory.logprobs).tolist() == pytest.approx(worker.expected, abs=1e-6)
    assert evaluation.reward == 0.5 and trajectory.error is None


class TrainsOnUnsampledTokens(BaseRolloutWorker):
    def rollout(self, task):
        result = self._inference_client.completion(task["prompt"])
        answer = self._inference_client.tokenizer(task["answer"])["input_ids"]
        tokens = result["prompt_tokens"] + answer  # a teacher-forced answer: never sampled
        return self._put_trajectory(Trajectory(tokens=tokens, loss_mask=[0] * len(result["prompt_tokens"]) + [1] * len(answer)))


class Crashes(BaseRolloutWorker):
    def rollout(self, task):
        raise KeyError("question")


class BadMask(BaseRolloutWorker):
    def rollout(self, task):
        return self._put_trajectory(Trajectory(tokens=[1, 2, 3], loss_mask=[1]))


class BadVersions(BaseRolloutWorker):
    def rollout(self, task):
        return self._put_trajectory(Trajectory(tokens=[1, 2, 3], loss_mask=[0, 1, 1], token_versions=[0, 1]))


@pytest.mark.parametrize(
    "cls, error",
    [
        (TrainsOnUnsampledTokens, "were not sampled by any completion"),
        (Crashes, "KeyError: 'question'"),
        (BadMask, "loss_mask has 1 entries for 3 tokens"),
        (BadVersions, "token_versions has 2 entries for 3 tokens"),
    ],
)
def test_a_failed_rollout_is_recorded_not_lost(server, cls, error):
    published = []
    trajectory, evaluation = make_worker(cls, server, published).run_task(task(), max_retries=1)
    assert error in trajectory.error and error in evaluation.error
    assert evaluation.reward == 0.0 and trajectory.finish_reason == "error"
    assert len(published) == 2


def test_a_task_newer_than_the_policy_is_re_rolled_then_recorded(server):
    published = []
    trajectory, _ = make_worker(SingleTurnWorker, server, published).run_task(task(min_weight_version=5), max_retries=2)
    assert "re-rollout" in trajectory.error


def test_the_default_worker_samples_a_batch_of_tasks_as_one_engine_batch(server):
    tasks = [
        Task(
            run_id="r",
            task_id=f"b{i}",
            group_id=f"g{i // 4}",
            sample_index=i % 4,
            group_size=4,
            prompt=f"{i}+1=",
            data={"answer": str(i + 1)},
        )
        for i in range(12)
    ]
    too_long = Task(run_id="r", task_id="long", group_id="g9", prompt="1+1=" * 50, data={"answer": "2"})
    newer = Task(run_id="r", task_id="newer", group_id="g8", prompt="2+2=", data={"answer": "4"}, min_weight_version=5)
    published, sizes_before = [], len(server.batch_sizes)
    worker = make_worker(SingleTurnWorker, server, published)
    worker._inference_client.max_prompt_tokens = 64
    left = worker.run_tasks([*tasks, too_long, newer], max_retries=2)
    # 13 prompts sampled together (the long one never reached the engine), no thread a task
    assert list(server.batch_sizes)[sizes_before:] == [13]
    # each finished task published its trajectory then its evaluation, with the usual ids
    assert [e.trajectory_id for e in published] == [t.task_id for t in tasks for _ in range(2)]
    for task_, (trajectory, evaluation) in zip(tasks, zip(published[::2], published[1::2])):
        assert isinstance(trajectory, TrajectoryEvent) and isinstance(evaluation, Evaluation)
        assert trajectory.group_id == task_.group_id and unpack_float32(trajectory.logprobs)[-1] < 0
        assert evaluation.reward in (0.0, 1.0)
    # the failed ones go back to run_task: the long prompt untried, the stale one with a retry fewer
    assert left == [(too_long, 2), (newer, 1)]
    trajectory, _ = worker.run_task(too_long, 2)
    assert "more than max_prompt_length (64)" in trajectory.error
    # with no retries left a failed try is recorded at once
    published.clear()
    assert worker.run_tasks([newer], max_retries=0) == []
    assert "re-rollout" in published[0].error and published[1].reward == 0.0


def test_a_worker_with_its_own_rollout_takes_a_thread_a_task(server):
    tasks = [task()]
    assert make_worker(TwoCallWorker, server, []).run_tasks(tasks, max_retries=3) == [(tasks[0], 3)]


class ForgetfulWorker(BaseRolloutWorker):
    """Like the guide's ConditionalWorker: builds its trajectory without copying is_val."""

    def rollout(self, task):
        result = self._inference_client.completion(task["prompt"], max_tokens=2)
        tokens = result["prompt_tokens"] + result["response_tokens"]
        return self._put_trajectory(
            {
                "tokens": tokens,
                "reward": 1.0,
                "is_val": False,
                "loss_mask": [0] * len(result["prompt_tokens"]) + [1] * len(result["response_tokens"]),
            }
        )


def test_a_validation_task_stays_validation_whatever_the_worker_returns(server):
    """The stream processors skip is_val events, so this rollout never becomes a sample."""
    published = []
    validation = Task(run_id="r", task_id="v1", group_id="gv", prompt="12+34=", data={"answer": "6"}, is_val=True)
    trajectory, evaluation = make_worker(ForgetfulWorker, server, published).run_task(validation)
    assert trajectory.is_val and evaluation.is_val
    assert trajectory.trajectory_id == evaluation.trajectory_id == "v1" and trajectory.group_id == "gv"


class LongPromptWorker(BaseRolloutWorker):
    """A custom worker that pads its prompt and asks for more tokens than the recipe allows."""

    def rollout(self, task):
        result = self._inference_client.completion(task["prompt"] * self._config["repeat"], max_tokens=100)
        tokens = result["prompt_tokens"] + result["response_tokens"]
        return self._put_trajectory(
            {
                "tokens": tokens,
                "reward": 1.0,
                "loss_mask": [0] * len(result["prompt_tokens"]) + [1] * len(result["response_tokens"]),
            }
        )


def test_length_limits_hold_for_a_custom_worker(server):
    published = []
    client = InferenceClient(server, SamplingParams(max_new_tokens=4), max_prompt_tokens=30)
    worker = LongPromptWorker({"repeat": 10}, client, ExactMatchEvaluator(), published.append)
    trajectory, evaluation = worker.run_task(task())
    prompt_tokens = len(encode(server.tokenizer, f"<|im_start|>user\n{'12+34=' * 10}<|im_end|>\n<|im_start|>assistant\n"))
    assert trajectory.error == f"PromptTooLong: the prompt has {prompt_tokens} tokens, more than max_prompt_length (30)"
    assert evaluation.reward == 0.0 and evaluation.error == trajectory.error
    worker = LongPromptWorker({"repeat": 1}, client, ExactMatchEvaluator(), published.append)
    trajectory, _ = worker.run_task(task())
    assert trajectory.error is None and 0 < len(unpack_int32(trajectory.tokens)) - trajectory.prompt_length <= 4
