"""The multi-turn note's listings on StreamRL (its import lines changed, nothing else):
the `ToolAgentLoop` subclass that caps a workflow at 15 assistant turns, registered by
the note's YAML and chosen per row (`agent_name`) or by `default_agent_loop`, with the
note's `actor_rollout_ref.rollout` block converted to the recipe's keys. The agent worker
runs it with the model's turns kept as sampled (thinking included)."""

from __future__ import annotations

import sys

import pytest

from streamrl.producers.agent_loop import AgentLimits
from streamrl.producers.agent_worker import AgentRolloutWorker
from streamrl.producers.evaluator import ExactMatchEvaluator
from streamrl.producers.verl_agent_loop import AgentLoopConfigError, ToolAgentLoop, load_agent_loops, make_loop
from streamrl.runtime.recipe import RecipeError, load_recipe
from streamrl.schema.events import unpack_int32, unpack_mask
from tests.conftest import REPO
from tests.test_agent_loop import IM_END, ScriptedClient, char_ids, make_task, registry, write_agent_config

# the note's skeleton, as printed; only its import line is StreamRL's (the guide's listing,
# checked against its text by tests/test_seed_listings.py)
SKELETON = (REPO / "tests" / "seed_examples" / "listings" / "s004_01.py").read_text()
# the note's registry file, as printed
REGISTRY = """
- name: long_workflow
  _target_: extensions.custom_rollouts.LongWorkflowAgent
  # optional custom args here
"""
# the note's config block, its placeholders filled in
CONFIG = """
actor_rollout_ref:
  rollout:
    multi_turn:
      enable: true
      max_assistant_turns: 15   # or higher
      max_user_turns: 15        # if you alternate user feedback
      tool_config_path: "verl_tools.yaml"
      interaction_config_path: "interaction.yaml"
      use_inference_chat_template: false  # keep reasoning tokens
    prompt_length: 2048        # make room for many turns
    response_length: 2048      # must fit tool responses + thinking
    agent:
      default_agent_loop: long_workflow
      agent_loop_config_path: "extensions/custom_rollouts.yaml"
"""
THINK_AND_CALL = [*char_ids('<think>again</think><tool_call>{"name": "lookup", "arguments": {"key": "ab"}}</tool_call>'), IM_END]


@pytest.fixture
def extensions(tmp_path):
    folder = tmp_path / "extensions"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "custom_rollouts.py").write_text(SKELETON)
    (folder / "custom_rollouts.yaml").write_text(REGISTRY)
    return folder


def test_the_notes_skeleton_caps_a_workflow_at_fifteen_turns(extensions):
    loops = load_agent_loops(extensions / "custom_rollouts.yaml")
    cls, args = loops["long_workflow"]
    assert issubclass(cls, ToolAgentLoop) and args == {}
    # the agent config's own limit is 8 turns: the skeleton's ignore_termination lifts it
    loop = make_loop(
        cls,
        args,
        client=ScriptedClient([THINK_AND_CALL] * 20),
        tools=registry(),
        limits=AgentLimits(max_total_tokens=100_000, max_tokens_per_turn=200),
    )
    episode = loop.run([{"role": "user", "content": "q"}], make_task().data)
    # the 15th turn ends the episode as soon as it is sampled: its call is not run
    assert episode.assistant_turns == 15 and episode.tool_calls == 14 and episode.termination == "max_assistant_turns"


def test_the_notes_config_block_is_the_recipes_keys(tmp_path):
    (tmp_path / "recipe.yaml").write_text(CONFIG)
    (tmp_path / "extensions").mkdir()
    (tmp_path / "extensions" / "custom_rollouts.yaml").write_text(REGISTRY)
    (tmp_path / "verl_tools.yaml").write_text(TOOL_CONFIG)
    (tmp_path / "interaction.yaml").write_text(INTERACTION_CONFIG)
    worker = load_recipe(tmp_path / "recipe.yaml").rollout_worker
    assert (worker.type, worker.max_assistant_turns, worker.max_user_turns) == ("agent", 15, 15)
    assert (worker.max_prompt_length, worker.max_response_length) == (2048, 2048)
    assert (worker.default_agent_loop, worker.agent_loop_config_path) == ("long_workflow", "extensions/custom_rollouts.yaml")
    assert (worker.tool_config_path, worker.interaction_config_path) == ("verl_tools.yaml", "interaction.yaml")
    (tmp_path / "think.yaml").write_text(
        CONFIG.replace("use_inference_chat_template: false", "use_inference_chat_template: true")
    )
    with pytest.raises(RecipeError, match="the model's turns are always the ids it sampled"):
        load_recipe(tmp_path / "think.yaml")


def test_the_agent_worker_runs_the_rows_loop_and_keeps_the_sampled_thinking(extensions, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(extensions.parent))
    config = {
        "agent_config_path": write_agent_config(tmp_path),  # its limits: 4 turns
        "agent_loop_config_path": str(extensions / "custom_rollouts.yaml"),
        "max_assistant_turns": 15,
        "max_response_length": 200,
    }
    client = ScriptedClient([THINK_AND_CALL] * 20)
    worker = AgentRolloutWorker(config, client, ExactMatchEvaluator(), lambda event: None)
    plain, _ = worker.run_task(make_task())  # no agent_name, no default: StreamRL's own loop, its 15-turn limit
    assert plain.extra_fields["termination"] == "max_assistant_turns" and len(client.prompts) == 15
    client.turns = [THINK_AND_CALL] * 20
    chosen, _ = worker.run_task(make_task(agent_name="long_workflow"))
    tokens, mask = unpack_int32(chosen.tokens).tolist(), unpack_mask(chosen.loss_mask).tolist()
    assert [t for t, m in zip(tokens, mask) if m] == THINK_AND_CALL * 15  # thinking kept, as sampled
    unknown, _ = worker.run_task(make_task(agent_name="nope"))
    assert "agent loop 'nope' is not registered (registered: long_workflow)" in unknown.error
    with pytest.raises(AgentLoopConfigError, match="default_agent_loop: 'other' is not registered"):
        AgentRolloutWorker({**config, "default_agent_loop": "other"}, client, ExactMatchEvaluator(), lambda event: None)


# a tool and an interaction in verl's shapes, as a verl user writes them (GSM8K-like)
VERL_CLASSES = """
from streamrl.api import BaseInteraction, BaseTool, ToolResponse

EVENTS = []

class AnswerTool(BaseTool):
    async def create(self, instance_id=None, ground_truth=None, **kwargs):
        self.truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        EVENTS.append(("create", self.truth))
        return "i1", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        correct = str(parameters["answer"]) == self.truth
        return ToolResponse(text="correct" if correct else "wrong"), 1.0 if correct else -0.1, {"checked": 1}

    async def release(self, instance_id, **kwargs):
        EVENTS.append(("release", instance_id))

class Teacher(BaseInteraction):
    async def start_interaction(self, instance_id=None, ground_truth=None, **kwargs):
        self.truth = ground_truth
        EVENTS.append(("start", self.name, ground_truth))
        return "x1"

    async def generate_response(self, instance_id, messages, **kwargs):
        done = messages[-1]["content"].strip() == self.truth
        return done, "Try again.", 1.0 if done else 0.0, {}

    async def finalize_interaction(self, instance_id, **kwargs):
        EVENTS.append(("finalize", instance_id))
"""
TOOL_CONFIG = """
tools:
  - class_name: verl_classes.AnswerTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: check_answer
        description: Checks an answer.
        parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
"""
INTERACTION_CONFIG = """
interaction:
  - name: teacher
    class_name: verl_classes.Teacher
    config: {}
"""


def test_verls_tools_and_interactions_run_with_the_rows_kwargs(tmp_path, monkeypatch):
    (tmp_path / "verl_classes.py").write_text(VERL_CLASSES)
    (tmp_path / "verl_tools.yaml").write_text(TOOL_CONFIG)
    (tmp_path / "interaction.yaml").write_text(INTERACTION_CONFIG)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the configs put their folder on it: undone after

    config = {
        "agent_config_path": write_agent_config(
            tmp_path, limits={"max_assistant_turns": 6, "max_user_turns": 3, "max_total_tokens": 4000}
        ),
        "tool_config_path": str(tmp_path / "verl_tools.yaml"),
        "interaction_config_path": str(tmp_path / "interaction.yaml"),
        "max_response_length": 200,
    }
    call = [*char_ids('<tool_call>{"name": "check_answer", "arguments": {"answer": "41"}}</tool_call>'), IM_END]
    wrong, right = [*char_ids("41"), IM_END], [*char_ids("42"), IM_END]
    client = ScriptedClient([call, wrong, right])
    worker = AgentRolloutWorker(config, client, ExactMatchEvaluator(), lambda event: None)
    row = {
        "tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "42"}}},
        "extra_info": {"interaction_kwargs": {"name": "teacher", "ground_truth": "42"}},
    }
    trajectory, evaluation = worker.run_task(make_task(**row))
    assert trajectory.error is None, trajectory.error
    import verl_classes  # imported by the configs, from their own folder

    tool_step = next(step for step in trajectory.extra_fields["trace"] if step["type"] == "tool")
    assert (tool_step["output"], tool_step["reward"], tool_step["metrics"]) == ("wrong", -0.1, {"checked": 1})
    # per-turn scores: 0 for "41", 1 for "42", which ends the episode; the reward adds them
    assert [t.reward for t in trajectory.turns if t.reward is not None] == [0.0, 1.0]
    # the reward: the evaluator's (exact match of "42": 1) plus the per-turn scores (0 + 1)
    assert trajectory.extra_fields["termination"] == "interaction_done" and evaluation.reward == 2.0
    assert verl_classes.EVENTS == [("start", "teacher", "42"), ("create", "42"), ("release", "i1"), ("finalize", "x1")]


def test_the_notes_loop_with_verls_interaction_records_turn_rewards_and_thinking_in_the_ledger(
    stack, ledger, run_id, tmp_path, extensions, monkeypatch
):
    """The note's three listings together, the worker's records read back from the ledger:
    the registered loop runs by default, the verl interaction's per-turn scores are the
    turns' rewards, and the trained ids are the sampled ones, thinking included."""
    import msgspec

    from streamrl.runtime.bus import EventPublisher
    from streamrl.runtime.topic_admin import create_run_topics
    from tests.conftest import SinkThread, wait_for

    (tmp_path / "verl_classes.py").write_text(VERL_CLASSES)
    (tmp_path / "interaction.yaml").write_text(INTERACTION_CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(extensions.parent))
    config = {
        "agent_config_path": write_agent_config(tmp_path, limits={"max_user_turns": 15, "max_total_tokens": 4000}),
        "interaction_config_path": str(tmp_path / "interaction.yaml"),
        "agent_loop_config_path": str(extensions / "custom_rollouts.yaml"),
        "default_agent_loop": "long_workflow",
        "max_response_length": 200,
    }
    thinking = [[*char_ids(f"<think>try {n}</think>4{n}"), IM_END] for n in (0, 1, 2)]
    create_run_topics(stack, run_id)
    with EventPublisher(stack) as publisher:
        worker = AgentRolloutWorker(config, ScriptedClient(thinking), ExactMatchEvaluator(), publisher.publish)
        row = {"extra_info": {"interaction_kwargs": {"name": "teacher", "ground_truth": "<think>try 2</think>42"}}}
        trajectory, _ = worker.run_task(msgspec.structs.replace(make_task(run_id=run_id, **row), task_id="t-verl"))
    assert trajectory.error is None, trajectory.error
    with SinkThread(stack, run_id):
        wait_for(
            lambda: ledger.execute("select count(*) from trajectories where run_id = %s", (run_id,)).fetchone()[0] == 1,
            60,
            what="the trajectory in the ledger",
        )
    rewards = ledger.execute(
        "select array_agg(reward order by turn_index) from trajectory_turns where run_id = %s and role = 'assistant'",
        (run_id,),
    ).fetchone()[0]
    assert rewards == [0.0, 0.0, 1.0]  # the teacher's score of each turn
    tokens, mask = ledger.execute(
        "select streamrl_int32s(tokens), streamrl_uint8s(loss_mask) from trajectories where run_id = %s", (run_id,)
    ).fetchone()
    assert [t for t, m in zip(tokens, mask) if m] == [t for turn in thinking for t in turn]  # thinking kept
