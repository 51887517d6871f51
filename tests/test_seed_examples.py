"""The guide's code listings run as printed (tests/seed_examples/listings/, only their
import lines changed; tests/test_seed_listings.py checks them against the guide's text and
tests/seed_examples/catalogue.py lists which block runs where, and why the others cannot):
workers on the real embedded engine, agent workers with the guide's agent config,
evaluators with hand-computed values, trainers on a real model, and a recipe written in
the guide's spellings (defaults, .sh env file, trainer.algorithm, trainer.train_service,
custom trainer by file + class name) run end to end with command-line overrides.
"""

from __future__ import annotations

import json
import math
import runpy
import shutil
from typing import ClassVar

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from streamrl.api import Batch, RemoteApiTrainer, SelfHostedTrainer
from streamrl.learner.batching import TrainItem
from streamrl.learner.remote_trainers import trainer_class
from streamrl.learner.trainer_factory import build_trainer
from streamrl.producers.evaluator import BaseEvaluationTarget, ExactMatchEvaluator
from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams
from streamrl.producers.rollout import InferenceClient, SingleTurnWorker, make_worker
from streamrl.runtime.config import Recipe
from streamrl.runtime.recipe import load_recipe
from streamrl.runtime.tiny_lm import build_tiny_model
from streamrl.schema.events import Task, unpack_mask
from tests.conftest import REPO, run_cli
from tests.seed_examples.listings import (
    _helpers,
    s000_01,
    s000_02,
    s000_03,
    s000_04,
    s000_05,
    s000_06,
    s000_07,
    s000_08,
    s000_09,
    s000_11,
    s000_12,
    s000_13,
    s001_01,
    s001_02,
    s001_03,
    s001_04,
    s001_05,
    s001_06,
    s001_07,
    s001_09,
    s001_11,
    s001_12,
    s001_14,
    s001_15,
    s001_16,
    s002_01,
    s002_02,
    s002_03,
    s002_04,
    s002_06,
    s002_07,
    s003_01,
    s003_02,
    s003_05,
    s003_07,
    s003_09,
    s003_10,
    s003_12,
    s004_01,
)
from tests.seed_examples.recipe.logging_worker import LoggingWorker

EXAMPLES = REPO / "tests" / "seed_examples"
LISTINGS = EXAMPLES / "listings"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("seed") / "model", max_positions=1024)
    engine = BatchingEngine(EmbeddedEngine(model, seed=3))
    yield InferenceClient(engine, SamplingParams(max_new_tokens=6, temperature=1.0))
    engine.close()


def roll(cls, client, config=None, evaluator=None, **row):
    published = []
    worker = make_worker(
        cls, {"temperature": 1.0, "max_tokens": 4, **(config or {})}, client, evaluator or ExactMatchEvaluator(), published.append
    )
    data = {"prompt": "2+3", "question": "2+3", "answer": "5", **row}
    trajectory, evaluation = worker.run_task(
        Task(run_id="seed", task_id="t", group_id="g", prompt=data["prompt"], data=data, step=4)
    )
    return worker, trajectory, evaluation


class ErrorHandlingWorker(s000_01.MySimpleWorker):
    """Listing 000_09's rollout, with the two helpers it calls and the guide leaves open."""

    rollout = s000_09.rollout

    def _process_task(self, task):
        return self._inference_client.completion(task["question"], max_tokens=4)

    def _create_trajectory(self, result, task):
        return {
            "tokens": result["prompt_tokens"] + result["response_tokens"],
            "loss_mask": [0] * len(result["prompt_tokens"]) + [1] * len(result["response_tokens"]),
            "reward": self._compute_reward(result["response"], task),
        }


def test_worker_listings(client, caplog):
    # 000_01 type 1, built as Worker(config); its trajectory trains the response; run_id is the group
    worker, trajectory, evaluation = roll(s000_01.MySimpleWorker, client)
    mask = unpack_mask(trajectory.loss_mask)
    assert trajectory.error is None and mask.sum() > 0 and trajectory.extra_fields["run_id"] == "g"
    assert worker.tokenizer is client.tokenizer and worker.logger.name.endswith("MySimpleWorker")
    # 000_03 type 3: two calls; only the answer's tokens train
    _, trajectory, _ = roll(s000_03.MultiStepWorker, client)
    assert trajectory.error is None and 0 < unpack_mask(trajectory.loss_mask).sum() <= 512
    # 000_04 pattern 1: templates loaded in __init__(config); its rollout returns nothing -> a recorded failure
    worker, trajectory, evaluation = roll(s000_04.TemplateWorker, client)
    assert worker._build_prompt({"question": "q"}) == "You are a helpful assistant.\n\nQ: q\n\nA:"
    assert trajectory.error == "rollout returned None" and evaluation.reward == 0.0
    # 000_05 pattern 2: its API client is None in the guide: the error is recorded, the group completes
    _, trajectory, _ = roll(s000_05.ToolIntegratedWorker, client, query="x")
    assert "AttributeError" in trajectory.error
    # 000_07 pattern 4: routed by the task's type
    _, trajectory, evaluation = roll(s000_07.ConditionalWorker, client, type="contains", answer="")
    assert evaluation.reward == 1.0 and trajectory.extra_fields["task_type"] == "contains"
    # 000_09 error handling: a task without its field is logged and ends as a recorded failure
    _, trajectory, _ = roll(ErrorHandlingWorker, client)
    assert trajectory.error is None and unpack_mask(trajectory.loss_mask).sum() > 0
    _, trajectory, _ = roll(ErrorHandlingWorker, client, question=None)
    assert trajectory.error == "rollout returned None"
    del_question = {"prompt": "2+3", "answer": "5"}
    worker = make_worker(ErrorHandlingWorker, {}, client, ExactMatchEvaluator(), lambda event: None)
    trajectory, _ = worker.run_task(Task(run_id="seed", task_id="t", group_id="g", prompt="2+3", data=del_question))
    assert trajectory.error == "rollout returned None" and "Missing required field: 'question'" in caplog.text
    # 000_11 configuration: the guide's DictConfig unit-test form, and the defaults
    worker = s000_11.MyWorker(DictConfig({"temperature": 0.7, "num_examples": 5}))
    assert (worker.use_few_shot, worker.num_examples, worker.answer_format) == (True, 5, "xml")
    # 000_12 the guide's worker unit tests, and 000_13's helper
    s000_12.test_query_formatting()
    s000_12.test_answer_extraction()
    assert s000_13.extract_xml_tag("a <b> x </b>", "b") == "x" and s000_13.extract_json("{}") == {}
    assert s000_13.MyWorker(DictConfig({}))._extract_answer("no tags") == "no tags"
    # 001_05's extra_info reaches the rollout's evaluation
    _, _, evaluation = roll(SingleTurnWorker, client, evaluator=s001_05.MyEvaluator(), id=11)
    assert evaluation.extra_info["data_id"] == 11 and "agent_output" in evaluation.extra_info
    # 001_19's logging call (in the recipe's worker): recorded with the rollout's evaluation metrics
    _, _, evaluation = roll(LoggingWorker, client)
    assert evaluation.metrics["agent_calls"] == 1.0 and evaluation.metrics["logged_step"] == 4.0
    with pytest.raises(RuntimeError, match="while a rollout runs"):
        LoggingWorker(DictConfig({}))._activity_tracker.experiment_logger_post("wandb", {"x": 1}, 0)


AGENT = {
    "agent_config_path": str(EXAMPLES / "agent_workspace" / "agent_config.yaml"),
    "agent_workspace": str(EXAMPLES / "agent_workspace"),
}


def test_agent_worker_listings(client):
    # 001_02 with the guide's agent config (type, name, max_context_tokens, system_prompt_type,
    # tool_call_mode, tracers, api_type, tools with binding); the binding's schema comes
    # from the function's signature
    worker, trajectory, evaluation = roll(s001_02.MyTaskWorker, client, AGENT, problem="2+3")
    schema = worker.tools.tools["calculator"].schema["function"]
    assert schema["parameters"] == {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    }
    assert worker.limits.max_total_tokens == 1000  # max_context_tokens
    tokens = list(np.frombuffer(trajectory.tokens, np.int32))
    prompt = client.tokenizer.decode(tokens[: trajectory.turns[0].end])
    # format_task_query is the user message (compared without whitespace: the built-in
    # character tokenizer does not keep it)
    assert "Problem:2+3Provideyoursolutionstepbystep." in "".join(prompt.split())
    assert "calculator" in prompt and trajectory.extra_fields["termination"] != "length"
    assert trajectory.extra_fields["trace"]  # save_trace (default on)
    assert trajectory.extra_fields["agent_name"] == "my_task_agent"  # the agent config's name, with every rollout
    # per-message masks: one value per LLM call; 001_03 trains every response (its example 1)
    _, everything, _ = roll(s001_03.MyTaskWorker, client, AGENT)
    trained_turns = [t for t in everything.turns if t.trained]
    assert trained_turns and {t.role for t in trained_turns} == {"assistant"}
    _, final_only, _ = roll(s002_04.MyTaskWorker, client, AGENT)  # is_final only
    assistant = [t for t in final_only.turns if t.role == "assistant"]
    assert [t.trained for t in assistant] == [False] * (len(assistant) - 1) + [True]
    # 000_06 per-token masks: no marker in the response -> all of it trains
    _, custom, _ = roll(s000_06.CustomTokenWorker, client, AGENT)
    assert unpack_mask(custom.loss_mask).sum() == sum(t.end - t.start for t in custom.turns if t.role == "assistant")
    # 000_02 type 2 (NexAU): load_agent_from_config, agent.run, InMemoryTracer, trace_processor,
    # the (agent_output, evaluation_result) return
    _, nexau, evaluation = roll(s000_02.MyAgentWorker, client, AGENT, instruction="add", context="2+3")
    assert nexau.error is None and unpack_mask(nexau.loss_mask).sum() > 0
    assert nexau.extra_fields["score"]["reward_score"] == evaluation.reward
    tokens = list(np.frombuffer(nexau.tokens, np.int32))
    prompt = "".join(client.tokenizer.decode(tokens[: nexau.turns[0].end]).split())
    assert "Instruction:add" in prompt and "Context:2+3" in prompt and "Pleasesolvethetask:" in prompt
    # 001_04 ComplexTaskWorker: self.agent.run(query, client=self.client, tracer=), tracer.get_trace()
    # children, child_processor, _generate_tokens, a per-call mask and a dict trajectory
    _, complex_run, evaluation = roll(TracedComplexWorker, client, AGENT, evaluator=s001_05.MyEvaluator())
    assert complex_run.error is None, complex_run.error
    tokens = list(np.frombuffer(complex_run.tokens, np.int32))
    calls = TracedComplexWorker.calls
    assert calls and tokens == list(calls[-1]["prompt_tokens"]) + list(calls[-1]["response_tokens"])
    sampled = [i for call in calls for i in range(call["start"], call["start"] + len(call["response_tokens"]))]
    mask = unpack_mask(complex_run.loss_mask)
    assert [i for i, m in enumerate(mask) if m] == sampled  # every call's response, nothing else
    logprobs = np.frombuffer(complex_run.logprobs, np.float32)  # recovered from the episode's completions
    assert len(logprobs) == len(tokens) and all(logprobs[i] < 0 for i in sampled)
    final_answer = complex_run.extra_fields["final_answer"]  # scored by 001_05's evaluator
    assert evaluation.metrics["output_length"] == float(len(final_answer))
    # 000_08: the workspace's module imported by its plain name; its rollout returns nothing
    _, workspace_run, _ = roll(s000_08.MyWorker, client, AGENT)
    assert workspace_run.error == "rollout returned None" and s000_08.my_tool_function() == "result"
    # agent workers in the guide's unit-test form, Worker(DictConfig): no agent config needed
    multi_turn = s001_14.MultiTurnWorker(DictConfig({"temperature": 0.7}))
    assert (
        multi_turn.format_task_query({"conversation": [{"role": "user", "content": "hi"}], "query": "2+3"})
        == "user: hi\nuser: 2+3\nassistant:"
    )
    assert (
        s002_03.MyTaskWorker(DictConfig({})).format_task_query({"context": "c", "question": "q"})
        == "Context: c\n\nQuestion: q\n\nPlease provide your answer:"
    )


def test_evaluator_listings(capsys):
    target = BaseEvaluationTarget
    assert s001_01.MyEvaluator().evaluate({"answer": "4"}, target("4")).reward == 1.0
    result = s001_05.MyEvaluator().evaluate({"answer": "4", "id": 7}, target("4"))
    assert (result.reward, result.metrics) == (1.0, {"exact_match": 1.0, "output_length": 1.0})
    assert result.extra_info == {"agent_output": "4", "data_id": 7}
    assert s001_06.ExtractorEvaluator().evaluate({"answer": "4"}, target("x")).metrics == {"extraction_failed": 1.0}
    assert s001_06.ExtractorEvaluator().evaluate({"answer": "4"}, target("<answer>4</answer>")).reward == 1.0
    # 0.5 * 0 (not equal) + 0.3 * 1/2 (one of two points) + 0.2 * 0.3 (under ten words) = 0.21
    multi = s001_07.MultiCriteriaEvaluator().evaluate({"answer": "x", "required_points": ["cat", "dog"]}, target("a cat"))
    assert multi.reward == pytest.approx(0.21)
    # "kitten" vs "sitting": 2 * 4 matching / 13 characters = 0.615 < 0.8
    fuzzy = s002_02.FuzzyMatchEvaluator().evaluate({"answer": "sitting"}, target("kitten"))
    assert fuzzy.reward == 0.0 and fuzzy.metrics["similarity"] == pytest.approx(8 / 13)
    # code generation: one of two tests passes (1 + 2 == 3; 1 + 2 != 4)
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    tests = [
        {"function_name": "add", "inputs": [1, 2], "expected_output": 3},
        {"function_name": "add", "inputs": [1, 2], "expected_output": 4},
    ]
    codegen = s001_15.CodeGenEvaluator().evaluate({"test_cases": tests}, target(code))
    assert codegen.reward == 0.5 and codegen.metrics["tests_failed"] == 1.0
    # reasoning: 0.7 * 1 (correct) + 0.3 * 1.0 (steps, 50-1000 characters) = 1.0; without steps 0.7 + 0.3 * 0.5
    steps = "Step 1: read the question. Step 2: add the two numbers together carefully."
    reasoning = s001_16.ReasoningEvaluator().evaluate(
        {"answer": "5"}, target(f"<reasoning>{steps}</reasoning><answer>5</answer>")
    )
    assert reasoning.reward == pytest.approx(1.0)
    no_steps = s001_16.ReasoningEvaluator().evaluate({"answer": "5"}, target("<reasoning>hm</reasoning><answer>5</answer>"))
    assert no_steps.reward == pytest.approx(0.85)
    assert "Question: 2+3" in s001_16.ReasoningWorker(DictConfig({})).format_task_query({"question": "2+3"})
    # the guide's standalone evaluator test (a script: it prints), and the recipe chapter's
    runpy.run_path(str(LISTINGS / "s001_18.py"))
    assert capsys.readouterr().out == "Reward: 0.0, Metrics: {'exact_match': 0.0, 'output_length': 11.0}\n"
    task_eval = s002_01.MyTaskEvaluator().evaluate({"answer": " 4 "}, target("4"))
    assert task_eval.reward == 1.0 and task_eval.extra_info == {"agent_answer": "4", "ground_truth": "4"}
    s002_07.test_evaluator()


def test_llm_judge_listing(sglang_python, tmp_path, monkeypatch):
    """001_08 as printed, against an OpenAI-compatible server: SGLang serving a small model
    taught to answer "0.5" (committed: tests/data/judge_warm), reached through the openai client's own settings
    (OPENAI_BASE_URL, OPENAI_API_KEY). The judge's number is the reward."""
    from streamrl.producers.sglang_server import ManagedServer
    from tests.helpers.warm_model import warm_model_folder
    from tests.seed_examples.listings import s001_08

    judge = warm_model_folder(tmp_path / "judge", "judge")  # tests/helpers/fine_tune.py: judge_examples
    server = ManagedServer(sglang_python, str(judge), "cpu", {}, tmp_path / "server.log")
    server.start()
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "none")
        result = s001_08.LLMJudgeEvaluator().evaluate({"question": "2+3?", "reference_answer": "5"}, BaseEvaluationTarget("5"))
    finally:
        server.stop()
    assert (result.reward, result.metrics, result.ground_truth) == (0.5, {"llm_judge_score": 0.5}, "5")


def test_data_listings(tmp_path, monkeypatch, capsys):
    """The recipe chapter's data preparation writes train.parquet; its validate_data accepts
    it; StreamRL's data.type parquet reads the same rows."""
    from streamrl.runtime.dataset import read_rows

    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(LISTINGS / "s002_05.py"))
    s002_06.validate_data("train.parquet")
    assert capsys.readouterr().out == "Dataset valid: 1 examples\n"
    rows = read_rows([str(tmp_path / "train.parquet")], "parquet", required_keys=("answer",), prompt_keys=("prompt",))
    assert rows == [{"prompt": "What is 2+2?", "answer": "4", "difficulty": "easy"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("seed-trainer") / "model", max_positions=64)


def items():
    def item(group, reward, trajectory_id):
        tokens = np.array([5, 6, 7, 8], np.int32)
        return TrainItem(
            tokens=tokens,
            mask=np.array([0, 0, 1, 1], np.uint8),
            reward=reward,
            group_id=group,
            behaviour_logprobs=np.full(4, -2.0, np.float32),
            trajectory_id=trajectory_id,
        )

    return [item("a", 1.0, "a0"), item("a", 0.0, "a1"), item("b", 1.0, "b0"), item("b", 1.0, "b1")]


def trainer_for(cls, model_dir, **algorithm):
    from transformers import AutoModelForCausalLM

    recipe = Recipe.from_dict({"trainer": {"lr": 1e-3, "micro_batch_tokens": 64}, "algorithm": algorithm})
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return build_trainer(cls, recipe, model, pad_id=0)


class TracedComplexWorker(s001_04.ComplexTaskWorker):
    """Listing 001_04's worker, keeping the LLM calls its trace walk found."""

    calls: ClassVar[list] = []

    def child_processor(self, child, trajectories):
        super().child_processor(child, trajectories)
        type(self).calls = list(trajectories)


class StatsTrainer(SelfHostedTrainer):
    """Listing 003_09's _prepare_batch with listing 003_10's _compute_advantages."""

    _prepare_batch = s003_09._prepare_batch
    _compute_advantages = s003_10._compute_advantages


class GrpoRemoteTrainer(RemoteApiTrainer):
    _prepare_trajectories = s001_12._prepare_trajectories


def test_trainer_listings(model_dir, tmp_path):
    # 003_01 pattern 1: advantage = reward * my_param, per row; the guide's metric reads
    # values["advantages"] (it wrote metadata["advantages"]: the rows' values stand in)
    trainer = trainer_for(s003_01.MyCustomTrainer, model_dir, extra={"my_param": 2.0})
    prepared, metrics = trainer.prepare(items())
    assert [i.advantage for i in prepared] == [2.0, 0.0, 2.0, 2.0] and metrics["advantage_mean"] == 1.5
    assert metrics["rollout/reward/mean"] == 0.75
    result = trainer.step(items())
    assert math.isfinite(result.loss) and result.metrics["advantage_mean"] == 1.5
    # do_old_log_prob_compute: the ratio's base is the learner's own logprobs -> ratio exactly 1
    trainer = trainer_for(s003_01.MyCustomTrainer, model_dir, do_old_log_prob_compute=True)
    assert trainer.step(items()).metrics["ratio"] == pytest.approx(1.0, abs=1e-6)
    # 003_12 the guide's trainer unit test: MyCustomTrainer(config) built outside the learner
    s003_12.test_custom_trainer_prepare_batch()
    # 001_09: per-token advantages in values["advantages"] (its helper: reward on the trained tokens)
    trainer = trainer_for(s001_09.MyCustomTrainer, model_dir)
    prepared, metrics = trainer.prepare(items())
    assert [list(i.token_advantages) for i in prepared][:2] == [[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    assert metrics["my_algorithm/mean_advantage"] == pytest.approx(6 / 16)
    # 003_02 pattern 2: reward minus its run_id's mean, times advantage_weight
    trainer = trainer_for(s003_02.MyRemoteTrainer, model_dir, extra={"advantage_weight": 3.0})
    prepared, metrics = trainer.prepare(items())
    assert [i.advantage for i in prepared] == [1.5, -1.5, 0.0, 0.0] and metrics["custom/advantage_mean"] == 0.0
    # 001_11: a feature per trajectory (its length), and a metric over them
    trainer = trainer_for(s001_11.MyRemoteTrainer, model_dir)
    prepared, metrics = trainer.prepare(items())
    assert [i["custom_feature"] for i in prepared] == [4.0] * 4 and metrics["my_metric"] == 4.0
    # 001_12: GRPO advantages by run_id (group a: +-0.7071; group b: 0)
    trainer = trainer_for(GrpoRemoteTrainer, model_dir)
    prepared, metrics = trainer.prepare(items())
    assert [round(i.advantage, 4) for i in prepared] == [0.7071, -0.7071, 0.0, 0.0]
    # 003_09 + 003_10: the statistics of (r - mean) / std over the batch, r = [1, 0, 1, 1]:
    # mean 0.75, std 0.5 (unbiased) -> [0.5, -1.5, 0.5, 0.5]
    trainer = trainer_for(StatsTrainer, model_dir)
    _, metrics = trainer.prepare(items())
    assert metrics["algorithm/advantage_mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["algorithm/advantage_max"] == pytest.approx(0.5, abs=1e-6)
    assert metrics["algorithm/advantage_std"] == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(s003_10._compute_advantages(None, Batch(metadata={"rewards": [1.0]})), torch.zeros(1))
    assert s003_10._compute_advantages(None, Batch(metadata={"rewards": []})).numel() == 0
    # 003_03 + 003_04 pattern 3, loaded as a recipe loads it: my_trainer.py imports its
    # neighbour relatively (`from .my_algorithm import ...`, the guide's own line). The
    # module's placeholder computes no advantages, and the learner says so.
    task = tmp_path / "recipe" / "my_task"
    task.mkdir(parents=True)
    shutil.copy(LISTINGS / "s003_03.py", task / "my_algorithm.py")
    (task / "my_trainer.py").write_text(
        (LISTINGS / "s003_04.py")
        .read_text()
        .replace("from tests.seed_examples.listings.s003_03 import", "from .my_algorithm import")
    )
    recipe = Recipe.from_dict(
        {
            "trainer": {
                "type": "custom",
                "custom_trainer_module_path": str(task / "my_trainer.py"),
                "custom_trainer_class_name": "MyTrainer",
            }
        }
    )
    cls = trainer_class(recipe)
    trainer = trainer_for(cls, model_dir, extra={"discount_factor": 0.5, "gae_lambda": 0.5})
    with pytest.raises(ValueError, match=r"metadata\['advantages'\] with 0 entries for 4 rows"):
        trainer.prepare(items())
    # 003_05 the KL penalty and 003_07 n-step returns, by hand
    batch = Batch(
        values={
            "log_probs": torch.tensor([[-1.0, -2.0]]),
            "ref_log_probs": torch.tensor([[-1.5, -1.0]]),
            "token_level_scores": torch.tensor([[0.0, 1.0]]),
        }
    )
    penalized = s003_05._apply_kl_penalty(None, batch, beta=0.1).values["token_level_scores"]
    assert torch.allclose(penalized, torch.tensor([[-0.05, 1.1]]))
    assert s003_07._compute_nstep_returns(None, [1.0, 0.0, 2.0], n=2, gamma=0.5) == [1.0, 1.0, 2.0]
    # the edge-case helper on a real batch (its rewards are a tensor): (r - 0.75) / (0.5 + 1e-8)
    advantages = s003_10._compute_advantages(None, _helpers.create_dummy_batch())
    assert torch.allclose(advantages, torch.tensor([0.5, -1.5, 0.5, 0.5]), atol=1e-6)


def test_guide_spellings_move_and_refused_keys_say_why(tmp_path, monkeypatch):
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    monkeypatch.setenv("SEED_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SEED_TRACE_DIR", str(tmp_path / "traces"))
    recipe = load_recipe(EXAMPLES / "recipe" / "self_hosted.yaml", ["trainer.lr=1e-4", "data.seed=3"])
    assert recipe.algorithm.extra == {"my_param": 0.5, "use_custom_advantage": True}  # from trainer.algorithm
    assert recipe.algorithm.do_old_log_prob_compute and recipe.trainer.nproc_per_node == 1  # world_size
    assert recipe.rollout_worker.rollout_repeat_n == 4 and recipe.rollout_worker.max_response_length == 4
    assert (recipe.trainer.lr, recipe.data.seed) == (1e-4, 3)
    refused = tmp_path / "refused.yaml"
    refused.write_text(
        "resource: {inference: {gpu_count: 2}}\nlaunch_mode: kubernetes\n"
        "service: {train_service: {backend: weaver}}\ntrainer: {type: remote_api_grpo}\n"
    )
    result = run_cli("recipe", "validate", str(refused))
    err = " ".join(result.stderr.split())
    assert result.returncode == 2
    assert "resource: not supported (StreamRL does not schedule Kubernetes pods" in err
    assert "launch_mode: not supported" in err and "only 'local'" in err
    assert "service.train_service.backend: 'weaver' is not supported: remote trainers speak the Tinker API" in err


# Recipes that contradict themselves, by the stage that finds it: the keys' own checks,
# then the settings against each other. `recipe validate` and `run` must agree on each.
CONTRADICTIONS = {
    "keys": ("data: {type: torch}\n", ["data.type: torch reads jsonl or parquet files by their extension; these files are none"]),
    "settings": (
        "trajectory_pool: {group_size: 3, batch_size: 8}\nrollout_worker: {rollout_repeat_n: 8, "
        "save_trace: false, trace_path: traces}\ntrainer: {type: self_hosted, custom_trainer_class_name: X}\n"
        "algorithm: {batch_size: 4}\n",
        [
            "trajectory_pool.group_size: 3 differs from rollout_worker.rollout_repeat_n (8)",
            "trainer.custom_trainer_module_path: required when trainer.type is self_hosted",
            "trainer.custom_trainer_class_name: needs trainer.custom_trainer_module_path",
            "algorithm.batch_size: 4 differs from trajectory_pool.batch_size (8)",
            "rollout_worker.trace_path: traces are written only with save_trace: true",
        ],
    ),
    "remote trainer": (
        "trainer: {type: remote_api_grpo, custom_trainer_module_path: t.py:A, custom_trainer_class_name: B}\n",
        [
            "trainer.type: remote_api_grpo trains through a remote training service: set "
            "service.train_service.backend: tinker and service.train_service.url",
            "trainer.custom_trainer_class_name: the module path names a class already",
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(CONTRADICTIONS))
def test_validate_and_run_refuse_the_same_recipes(tmp_path, name):
    text, problems = CONTRADICTIONS[name]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    for command in (("recipe", "validate"), ("run",)):
        result = run_cli(*command, str(path))
        said = " ".join(result.stderr.split())
        assert result.returncode == 2 and all(problem in said for problem in problems), (command, result.stderr)


def test_the_guide_style_recipe_trains_with_its_custom_code(stack, ledger, run_id, tmp_path):
    assert run_cli("recipe", "validate", "recipes/arith/recipe.yaml").returncode == 0  # builds the model it uses
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "question": f"{a}+{b}", "answer": str((a + b) % 10)} for a in range(4) for b in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {"SEED_DATA_DIR": str(data), "SEED_TRACE_DIR": str(tmp_path / "traces")}
    result = run_cli(
        "run",
        "tests/seed_examples/recipe/self_hosted.yaml",
        "trainer.total_train_steps=2",
        "algorithm.filter_zero_variance=false",
        "rollout_worker.use_few_shott=true",  # misspelt own keys
        "algorithm.clip_ratio_hgh=0.3",
        "--run",
        run_id,
        "--out",
        str(tmp_path / "out"),
        env=env,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # ... that the worker and the trainer never read: said once each, in the ledger (the worker's own
    # max_tokens and the trainer's my_param were read)
    unread = ledger.execute(
        "select details from run_events where run_id = %s and kind = 'config_unread' order by details->>'section' desc", (run_id,)
    ).fetchall()
    assert unread == [
        ({"section": "rollout_worker", "keys": ["use_few_shott"]},),
        ({"section": "algorithm", "keys": ["clip_ratio_hgh"]},),
    ]  # the trainer's, after its first step
    steps = ledger.execute("select step, metrics from train_steps where run_id = %s order by step", (run_id,)).fetchall()
    assert [s for s, _ in steps] == [1, 2]
    for _, metrics in steps:  # the custom trainer's metric, and do_old_log_prob_compute's ratio of exactly 1
        assert "advantage_mean" in metrics and metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    config = ledger.execute("select config from run_events where run_id = %s and kind = 'created'", (run_id,)).fetchone()[0]
    assert config["trainer"]["total_train_steps"] == 2 and config["algorithm"]["my_param"] == 0.5
    assert config["algorithm"]["filter_zero_variance"] is False
    metrics = ledger.execute("select metrics from evaluations where run_id = %s and not is_val limit 1", (run_id,)).fetchone()[0]
    assert metrics["agent_calls"] == 1.0 and "custom_metric" in metrics  # experiment_logger_post
    per_step = ledger.execute(
        "select step, mean, rollouts from worker_metrics where run_id = %s and name = 'agent_calls' order by step", (run_id,)
    ).fetchall()
    assert [s for s, _, _ in per_step][:2] == [1, 2] and all(mean == 1.0 and n >= 16 for _, mean, n in per_step)
    # remove_previous_ckpt: only the newest checkpoint is left
    assert [p.name for p in (tmp_path / "traces" / "ckpt" / run_id).glob("step-*")] == ["step-000002"]
    traces = list((tmp_path / "traces" / run_id).glob("*.json"))
    assert traces and json.loads(traces[0].read_text())["trace"][0]["type"] == "llm"


def test_the_guides_full_configuration_example_names_every_key_it_cannot_honour():
    """The guide's reference listing, as printed: each key StreamRL does not implement is
    named with its reason, each file it names is looked for; the rest is taken."""
    with pytest.raises(Exception) as info:
        load_recipe(EXAMPLES / "recipe" / "full_reference.yaml")
    named = {problem.split(":")[0] for problem in info.value.problems}
    assert named == {
        "hydra",
        "resource",
        "runtime_monitor",
        "algorithm.inference_service",
        "data.num_workers",
        "rollout_worker.tokenizer",
        "trajectory_pool.key_list",  # logger.backend: wandb and logger.wandb are taken
        "service.train_service.url",
        "service.train_service.model_tag",  # a self-hosted learner has no url
        "environment.setup_script",
        "data.data_files[0]",
        "validate.data.data_files[0]",
        "rollout_worker.custom_rollout_worker_module_path",
        "rollout_worker.agent_config_path",
        "rollout_worker.agent_workspace",
    }


def test_a_prompt_longer_than_max_prompt_length_fails_its_rollout(client):
    from streamrl.producers.rollout import SingleTurnWorker

    short = InferenceClient(client._engine, SamplingParams(max_new_tokens=2), max_prompt_tokens=2)
    _, trajectory, evaluation = roll(SingleTurnWorker, short)
    assert "more than max_prompt_length (2)" in trajectory.error and evaluation.reward == 0.0


def test_multi_turn_note_listing():
    """The note's ToolAgentLoop skeleton, run by the agent loop: it ignores the agent's own
    turn limit (8) and ends the episode at its 15th assistant turn."""
    from streamrl.producers.agent_loop import AgentLimits
    from tests.test_agent_loop import IM_END, ScriptedClient, char_ids, make_task, registry

    call = [*char_ids('<tool_call>{"name": "lookup", "arguments": {"key": "ab"}}</tool_call>'), IM_END]
    loop = s004_01.LongWorkflowAgent(
        ScriptedClient([call] * 20), registry(), limits=AgentLimits(max_tokens_per_turn=100, max_total_tokens=50_000)
    )
    episode = loop.run([{"role": "user", "content": "q"}], make_task().data)
    assert (episode.assistant_turns, episode.tool_calls, episode.termination) == (15, 14, "max_assistant_turns")
