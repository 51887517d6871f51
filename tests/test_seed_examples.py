"""The guide's code examples (tests/seed_examples/), changed only in their import lines,
load and run on StreamRL: workers on the real embedded engine, agent workers with the
guide's agent config, evaluators, trainers on a real model, and a recipe written in the
guide's spellings (defaults, .sh env file, trainer.algorithm, trainer.train_service,
custom trainer by file + class name) run end to end with command-line overrides.

Examples counted (code listings of the guide's chapters that define something to run):
workers chapter 12 (MySimpleWorker, MyAgentWorker, MultiStepWorker, TemplateWorker,
ToolIntegratedWorker, CustomTokenWorker, ConditionalWorker, MyWorker config,
extract_xml_tag + MyWorker, error handling, debug logging, trajectory fields), user guide
15 (MyEvaluator x2, MyTaskWorker x2 forms, ComplexTaskWorker, ExtractorEvaluator,
MultiCriteriaEvaluator, LLMJudgeEvaluator, MyCustomTrainer, MyRemoteTrainer,
MultiTurnWorker, CodeGenEvaluator, ReasoningWorker + ReasoningEvaluator, standalone
evaluator test, experiment_logger_post), recipe chapter 5 (MyTaskEvaluator,
FuzzyMatchEvaluator, MyTaskWorker x2, recipe files), trainers chapter 8 (patterns 1-3,
KL penalty, value function, n-step returns, edge cases, unit test). 40 in all; run here:
27 (see each test). Not run: ComplexTaskWorker (it drives a NexAU agent object with
`agent.run(query, client=, tracer=)` and `tracer.get_trace()` children), the LLM judge (a hosted API),
the value-function and code-execution patterns (undefined helpers), and fragments.
Where the guide's own code reads a field it never sets (pattern 1 reads
`values["advantages"]` after writing `metadata["advantages"]`), that line is marked.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from learner.trainer_factory import build_trainer
from learner.batching import TrainItem
from producers.evaluator import BaseEvaluationTarget, ExactMatchEvaluator
from producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams
from producers.rollout import InferenceClient, make_worker
from runtime.config import Recipe
from runtime.recipe import load_recipe
from runtime.tiny_lm import build_tiny_model
from schema.events import Task, unpack_mask
from tests.conftest import REPO, run_cli
from tests.seed_examples import agents_and_evaluators as ch_agents
from tests.seed_examples import trainers_ch3 as ch3
from tests.seed_examples import workers_ch1 as ch1

EXAMPLES = REPO / "tests" / "seed_examples"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("seed") / "model", max_positions=1024)
    engine = BatchingEngine(EmbeddedEngine(model, seed=3))
    yield InferenceClient(engine, SamplingParams(max_new_tokens=6, temperature=1.0))
    engine.close()


def roll(cls, client, config=None, evaluator=None, **row):
    published = []
    worker = make_worker(cls, {"temperature": 1.0, "max_tokens": 4, **(config or {})}, client,
                         evaluator or ExactMatchEvaluator(), published.append)
    data = {"prompt": "2+3", "question": "2+3", "answer": "5", **row}
    trajectory, evaluation = worker.run_task(Task(run_id="seed", task_id="t", group_id="g", prompt=data["prompt"],
                                                  data=data, step=4))
    return worker, trajectory, evaluation


def test_worker_chapter_examples_run(client):
    # type 1: built as Worker(config); its trajectory trains the response; run_id is the group
    worker, trajectory, evaluation = roll(ch1.MySimpleWorker, client)
    mask = unpack_mask(trajectory.loss_mask)
    assert trajectory.error is None and mask.sum() > 0 and trajectory.extra_fields["run_id"] == "g"
    assert worker.tokenizer is client.tokenizer and worker.logger.name.endswith("MySimpleWorker")
    # type 3: two calls; only the answer's tokens train
    _, trajectory, _ = roll(ch1.MultiStepWorker, client)
    assert trajectory.error is None and 0 < unpack_mask(trajectory.loss_mask).sum() <= 512
    # pattern 1: templates loaded in __init__(config); its rollout returns nothing -> a recorded failure
    worker, trajectory, evaluation = roll(ch1.TemplateWorker, client)
    assert worker._build_prompt({"question": "q"}) == "You are a helpful assistant.\n\nQ: q\n\nA:"
    assert trajectory.error == "rollout returned None" and evaluation.reward == 0.0
    # pattern 2: its API client is None in the guide: the error is recorded, the group completes
    _, trajectory, _ = roll(ch1.ToolIntegratedWorker, client, query="x")
    assert "AttributeError" in trajectory.error
    # pattern 4: routed by the task's type
    _, trajectory, evaluation = roll(ch1.ConditionalWorker, client, type="contains", answer="")
    assert evaluation.reward == 1.0 and trajectory.extra_fields["task_type"] == "contains"
    # configuration: the guide's DictConfig unit test form, and the defaults
    worker = ch1.MyWorker(DictConfig({"temperature": 0.7, "num_examples": 5}))
    assert (worker.use_few_shot, worker.num_examples, worker.answer_format) == (True, 5, "xml")
    assert ch1.XmlAnswerWorker(DictConfig({}))._extract_answer("so <answer> 4 </answer>") == "4"
    # the evaluator's extra_info reaches the rollout's evaluation
    from producers.rollout import SingleTurnWorker
    _, _, evaluation = roll(SingleTurnWorker, client, evaluator=ch_agents.MyEvaluator(), id=11)
    assert evaluation.extra_info["data_id"] == 11 and "agent_output" in evaluation.extra_info
    # the guide's logging call: recorded with the rollout's evaluation metrics
    _, _, evaluation = roll(ch1.LoggingWorker, client)
    assert evaluation.metrics["agent_calls"] == 1.0 and evaluation.metrics["logged_step"] == 4.0
    with pytest.raises(RuntimeError, match="while a rollout runs"):
        ch1.MySimpleWorker(DictConfig({}))._activity_tracker.experiment_logger_post("wandb", {"x": 1}, 0)


AGENT = {"agent_config_path": str(EXAMPLES / "agent_workspace" / "agent_config.yaml"),
         "agent_workspace": str(EXAMPLES / "agent_workspace")}


def test_agent_worker_examples_and_the_guides_agent_config(client):
    # the guide's agent config (type, name, max_context_tokens, system_prompt_type,
    # tool_call_mode, tracers, api_type, tools with binding) loads; the binding's schema
    # comes from the function's signature
    worker, trajectory, evaluation = roll(ch_agents.MyTaskWorker, client, AGENT, problem="2+3")
    schema = worker.tools.tools["calculator"].schema["function"]
    assert schema["parameters"] == {"type": "object", "properties": {"expression": {"type": "string"}},
                                    "required": ["expression"]}
    assert worker.limits.max_total_tokens == 1000  # max_context_tokens
    tokens = list(np.frombuffer(trajectory.tokens, np.int32))
    prompt = client.tokenizer.decode(tokens[:trajectory.turns[0].end])
    # format_task_query is the user message (compared without whitespace: the built-in
    # character tokenizer does not keep it)
    assert "Problem:2+3Provideyoursolutionstepbystep." in "".join(prompt.split())
    assert "calculator" in prompt and trajectory.extra_fields["termination"] != "length"
    assert trajectory.extra_fields["trace"]  # save_trace (default on)
    # per-message masks: one value per LLM call; every response trains by default
    _, everything, _ = roll(ch_agents.AllResponsesWorker, client, AGENT)
    trained_turns = [t for t in everything.turns if t.trained]
    assert trained_turns and {t.role for t in trained_turns} == {"assistant"}
    _, final_only, _ = roll(ch_agents.FinalOnlyWorker, client, AGENT)
    assistant = [t for t in final_only.turns if t.role == "assistant"]
    assert [t.trained for t in assistant] == [False] * (len(assistant) - 1) + [True]
    # per-token masks (pattern 3): no marker in the response -> all of it trains
    _, custom, _ = roll(ch1.CustomTokenWorker, client, AGENT)
    assert unpack_mask(custom.loss_mask).sum() == sum(t.end - t.start for t in custom.turns if t.role == "assistant")
    # type 2 (NexAU): load_agent_from_config, agent.run, InMemoryTracer, trace_processor,
    # the (agent_output, evaluation_result) return
    _, nexau, evaluation = roll(ch_agents.MyAgentWorker, client, AGENT, instruction="add", context="2+3")
    assert nexau.error is None and unpack_mask(nexau.loss_mask).sum() > 0
    assert nexau.extra_fields["score"]["reward_score"] == evaluation.reward
    tokens = list(np.frombuffer(nexau.tokens, np.int32))
    prompt = "".join(client.tokenizer.decode(tokens[:nexau.turns[0].end]).split())
    assert "Instruction:add" in prompt and "Context:2+3" in prompt and "Pleasesolvethetask:" in prompt
    worker = ch_agents.MultiTurnWorker.__new__(ch_agents.MultiTurnWorker)
    assert worker.format_task_query({"conversation": [{"role": "user", "content": "hi"}], "query": "2+3"}) == \
        "user: hi\nuser: 2+3\nassistant:"


def test_evaluator_examples_give_hand_computed_values():
    target = BaseEvaluationTarget
    result = ch_agents.MyEvaluator().evaluate({"answer": "4", "id": 7}, target("4"))
    assert (result.reward, result.metrics) == (1.0, {"exact_match": 1.0, "output_length": 1.0})
    assert result.extra_info == {"agent_output": "4", "data_id": 7}
    assert ch_agents.ExtractorEvaluator().evaluate({"answer": "4"}, target("x")).metrics == {"extraction_failed": 1.0}
    assert ch_agents.ExtractorEvaluator().evaluate({"answer": "4"}, target("<answer>4</answer>")).reward == 1.0
    # 0.5 * 0 (not equal) + 0.3 * 1/2 (one of two points) + 0.2 * 0.3 (under ten words) = 0.21
    multi = ch_agents.MultiCriteriaEvaluator().evaluate({"answer": "x", "required_points": ["cat", "dog"]},
                                                        target("a cat"))
    assert multi.reward == pytest.approx(0.21)
    # "kitten" vs "sitting": 2 * 4 matching / 13 characters = 0.615 < 0.8
    fuzzy = ch_agents.FuzzyMatchEvaluator().evaluate({"answer": "sitting"}, target("kitten"))
    assert fuzzy.reward == 0.0 and fuzzy.metrics["similarity"] == pytest.approx(8 / 13)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("seed-trainer") / "model", max_positions=64)


def items():
    def item(group, reward, trajectory_id):
        tokens = np.array([5, 6, 7, 8], np.int32)
        return TrainItem(tokens=tokens, mask=np.array([0, 0, 1, 1], np.uint8), reward=reward, group_id=group,
                         behaviour_logprobs=np.full(4, -2.0, np.float32), trajectory_id=trajectory_id)
    return [item("a", 1.0, "a0"), item("a", 0.0, "a1"), item("b", 1.0, "b0"), item("b", 1.0, "b1")]


def trainer_for(cls, model_dir, **algorithm):
    from transformers import AutoModelForCausalLM
    recipe = Recipe.from_dict({"trainer": {"lr": 1e-3, "micro_batch_tokens": 64}, "algorithm": algorithm})
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return build_trainer(cls, recipe, model, pad_id=0)


def test_trainer_examples_prepare_what_the_learner_trains(model_dir):
    # pattern 1: advantage = reward * my_param, per row; the guide's metric recorded
    trainer = trainer_for(ch3.MyCustomTrainer, model_dir, extra={"my_param": 2.0})
    prepared, metrics = trainer.prepare(items())
    assert [i.advantage for i in prepared] == [2.0, 0.0, 2.0, 2.0] and metrics["advantage_mean"] == 1.5
    assert metrics["rollout/reward/mean"] == 0.75
    result = trainer.step(items())
    assert math.isfinite(result.loss) and result.metrics["advantage_mean"] == 1.5
    # pattern 2: reward minus its run_id's mean, times advantage_weight
    trainer = trainer_for(ch3.MyRemoteTrainer, model_dir, extra={"advantage_weight": 3.0})
    prepared, metrics = trainer.prepare(items())
    assert [i.advantage for i in prepared] == [1.5, -1.5, 0.0, 0.0] and metrics["custom/advantage_mean"] == 0.0
    # pattern 3: the algorithm module, configured from config.algorithm
    trainer = trainer_for(ch3.MyTrainer, model_dir, extra={"discount_factor": 0.5, "gae_lambda": 0.5})
    prepared, _ = trainer.prepare(items())
    assert [i.advantage for i in prepared] == [0.25, 0.0, 0.25, 0.25]
    # do_old_log_prob_compute: the ratio's base is the learner's own logprobs -> ratio exactly 1
    trainer = trainer_for(ch3.MyCustomTrainer, model_dir, do_old_log_prob_compute=True)
    assert trainer.step(items()).metrics["ratio"] == pytest.approx(1.0, abs=1e-6)
    # the KL penalty, n-step returns and the edge-case helper, by hand
    from learner.batch_trainers import Batch
    batch = Batch(values={"log_probs": torch.tensor([[-1.0, -2.0]]), "ref_log_probs": torch.tensor([[-1.5, -1.0]]),
                          "token_level_scores": torch.tensor([[0.0, 1.0]])})
    penalized = ch3._apply_kl_penalty(None, batch, beta=0.1).values["token_level_scores"]
    assert torch.allclose(penalized, torch.tensor([[-0.05, 1.1]]))
    assert ch3._compute_nstep_returns(None, [1.0, 0.0, 2.0], n=2, gamma=0.5) == [1.0, 1.0, 2.0]
    batch = Batch(metadata={"rewards": torch.tensor([1.0, 0.0])})
    assert torch.allclose(ch3._compute_advantages(None, batch), torch.tensor([0.7071, -0.7071]), atol=1e-4)


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
    refused.write_text("resource: {inference: {gpu_count: 2}}\nlaunch_mode: kubernetes\n"
                       "service: {train_service: {backend: weaver}}\ntrainer: {type: remote_api_grpo}\n")
    result = run_cli("recipe", "validate", str(refused))
    err = " ".join(result.stderr.split())
    assert result.returncode == 2
    assert "resource: not supported (StreamRL does not schedule Kubernetes pods" in err
    assert "launch_mode: not supported" in err and "only 'local'" in err
    assert "service.train_service.backend: 'weaver' is not supported: remote trainers speak the Tinker API" in err


# Recipes that contradict themselves, by the stage that finds it: the keys' own checks,
# then the settings against each other. `recipe validate` and `run` must agree on each.
CONTRADICTIONS = {
    "keys": ("data: {type: torch}\n",
             ["data.type: torch reads jsonl or parquet files by their extension; these files are none"]),
    "settings": ("trajectory_pool: {group_size: 3, batch_size: 8}\nrollout_worker: {rollout_repeat_n: 8, "
                 "save_trace: false, trace_path: traces}\ntrainer: {type: self_hosted, custom_trainer_class_name: X}\n"
                 "algorithm: {batch_size: 4}\n",
                 ["trajectory_pool.group_size: 3 differs from rollout_worker.rollout_repeat_n (8)",
                  "trainer.custom_trainer_module_path: required when trainer.type is self_hosted",
                  "trainer.custom_trainer_class_name: needs trainer.custom_trainer_module_path",
                  "algorithm.batch_size: 4 differs from trajectory_pool.batch_size (8)",
                  "rollout_worker.trace_path: traces are written only with save_trace: true"]),
    "remote trainer": ("trainer: {type: remote_api_grpo, custom_trainer_module_path: t.py:A, "
                       "custom_trainer_class_name: B}\n",
                       ["trainer.type: remote_api_grpo trains through a remote training service: set "
                        "service.train_service.backend: tinker and service.train_service.url",
                        "trainer.custom_trainer_class_name: the module path names a class already"]),
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
    result = run_cli("run", "tests/seed_examples/recipe/self_hosted.yaml", "trainer.total_train_steps=2",
                     "algorithm.filter_zero_variance=false", "rollout_worker.use_few_shott=true",  # a misspelt own key
                     "--run", run_id, "--out", str(tmp_path / "out"), env=env, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # ... that the worker never read: said once, in the ledger (its own max_tokens was read)
    unread = ledger.execute("select details from run_events where run_id = %s and kind = 'config_unread'",
                            (run_id,)).fetchall()
    assert unread == [({"section": "rollout_worker", "keys": ["use_few_shott"]},)]
    steps = ledger.execute("select step, metrics from train_steps where run_id = %s order by step", (run_id,)).fetchall()
    assert [s for s, _ in steps] == [1, 2]
    for _, metrics in steps:  # the custom trainer's metric, and do_old_log_prob_compute's ratio of exactly 1
        assert "advantage_mean" in metrics and metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    config = ledger.execute("select config from run_events where run_id = %s and kind = 'created'",
                            (run_id,)).fetchone()[0]
    assert config["trainer"]["total_train_steps"] == 2 and config["algorithm"]["my_param"] == 0.5
    assert config["algorithm"]["filter_zero_variance"] is False
    metrics = ledger.execute("select metrics from evaluations where run_id = %s and not is_val limit 1",
                             (run_id,)).fetchone()[0]
    assert metrics["agent_calls"] == 1.0 and "custom_metric" in metrics  # experiment_logger_post
    per_step = ledger.execute("select step, mean, rollouts from worker_metrics where run_id = %s and name = "
                              "'agent_calls' order by step", (run_id,)).fetchall()
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
        "hydra", "resource", "runtime_monitor", "algorithm.inference_service", "data.num_workers",
        "rollout_worker.tokenizer", "trajectory_pool.key_list",  # logger.backend: wandb and logger.wandb are taken
        "service.train_service.url", "service.train_service.model_tag",  # a self-hosted learner has no url
        "environment.setup_script", "data.data_files[0]", "validate.data.data_files[0]",
        "rollout_worker.custom_rollout_worker_module_path", "rollout_worker.agent_config_path",
        "rollout_worker.agent_workspace"}


def test_a_prompt_longer_than_max_prompt_length_fails_its_rollout(client):
    from producers.rollout import SingleTurnWorker
    short = InferenceClient(client._engine, SamplingParams(max_new_tokens=2), max_prompt_tokens=2)
    _, trajectory, evaluation = roll(SingleTurnWorker, short)
    assert "more than max_prompt_length (2)" in trajectory.error and evaluation.reward == 0.0
