"""The multi-turn agent loop: token layout, masks, tools, interactions, limits; and a
15-turn episode recorded turn by turn in the ledger (real broker and PostgreSQL)."""

from __future__ import annotations

import json
import textwrap

import msgspec
import numpy as np
import pytest

from streamrl.producers.agent_loop import AgentLimits, run_agent_loop
from streamrl.producers.agent_worker import AgentConfigError, AgentRolloutWorker, load_agent_config
from streamrl.producers.evaluator import ExactMatchEvaluator
from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams
from streamrl.producers.interaction import ScriptedUser
from streamrl.producers.rollout import InferenceClient
from streamrl.producers.tools import ToolConfigError, ToolRegistry
from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.chat_template import ChatRenderer, demonstration_tokens, encode
from streamrl.runtime.tiny_lm import build_tiny_model, build_tokenizer
from streamrl.runtime.tool_call_formats import parse_hermes
from streamrl.runtime.topic_admin import create_run_topics
from streamrl.schema.events import Task, unpack_float32, unpack_int32, unpack_mask
from tests.conftest import SinkThread, wait_for

TOKENIZER = build_tokenizer("chatml")
RENDERER = ChatRenderer(TOKENIZER)
IM_END = TOKENIZER.convert_tokens_to_ids("<|im_end|>")


def char_ids(text: str) -> list[int]:
    """Ids of `text` one byte at a time (the byte-level tokenizer's byte b is id b): not
    what the tokenizer would produce for "<tool_call>" (one added token), so a
    re-tokenising loop would change them."""
    return list(text.encode())


def chatml(text: str) -> list[int]:
    return encode(TOKENIZER, text)


TOOL_RESULT_42 = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


class ScriptedClient:
    """Plays fixed token ids as the model's turns (the engine's completion shape)."""

    def __init__(self, turns: list[list[int]], weight_version: int = 3):
        self.tokenizer = TOKENIZER
        self.turns = list(turns)
        self.prompts: list[list[int]] = []
        self.weight_version = weight_version

    def begin(self, is_val: bool = False, seed_key: str | None = None) -> None:  # the InferenceClient's per-rollout hooks
        pass

    def recorded(self) -> list:
        return []

    def completion(self, prompt, temperature=None, max_tokens=None, top_p=None, stop_token_ids=()):
        self.prompts.append(list(prompt))
        response = self.turns.pop(0)
        if max_tokens is not None and len(response) > max_tokens:
            response, reason = response[:max_tokens], "length"
        else:
            reason = "stop" if response and response[-1] in stop_token_ids else "length"
        logprobs = [-0.01 * (i + 1) for i in range(len(response))]
        return {
            "prompt_tokens": list(prompt),
            "response_tokens": response,
            "logprobs": logprobs,
            "finish_reason": reason,
            "weight_version": self.weight_version,
            "response": self.tokenizer.decode(response, skip_special_tokens=True),
        }


def lookup(key: str, task: dict) -> str:
    return task["database"][key]


def fail(key: str) -> str:
    raise RuntimeError("backend down")


def registry() -> ToolRegistry:
    schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"], "additionalProperties": False}
    return ToolRegistry.from_config(
        [
            {
                "callable": "tests.test_agent_loop:lookup",
                "tool_schema": {"type": "function", "function": {"name": "lookup", "parameters": schema}},
            },
            {
                "callable": "tests.test_agent_loop:fail",
                "tool_schema": {"type": "function", "function": {"name": "fail", "parameters": schema}},
            },
        ],
        base_dir=".",
    )


def write_agent_config(folder, **overrides) -> str:
    (folder / "tools.py").write_text("def lookup(key, task):\n    return task['database'][key]\n")
    (folder / "tools.yaml").write_text(
        textwrap.dedent("""
        tools:
          - callable: tools.py:lookup
            tool_schema:
              type: function
              function:
                name: lookup
                parameters: {type: object, properties: {key: {type: string}}, required: [key]}
    """)
    )
    config = {
        "system_prompt": "Use the tool.",
        "tools": "tools.yaml",
        "tools_in_system_prompt": False,
        "llm_config": {"max_tokens": 200},
        "limits": {"max_assistant_turns": 4, "max_total_tokens": 2000},
    }
    config.update(overrides)
    (folder / "agent.yaml").write_text(json.dumps(config))
    return str(folder / "agent.yaml")


def make_task(run_id="agent-test", **data) -> Task:
    row = {"prompt": "key: ab", "answer": "42", "database": {"ab": "42"}, **data}
    return Task(run_id=run_id, task_id="t-1", group_id="g-1", prompt=row["prompt"], data=row, step=1)


def test_scripted_episode_has_the_exact_token_and_mask_layout(tmp_path):
    # turn 1 thinks, then calls the tool, spelled character by character; turn 2 answers
    turn1 = [*char_ids('<think>need ab</think><tool_call>{"name": "lookup", "arguments": {"key": "ab"}}</tool_call>'), IM_END]
    turn2 = [*char_ids("42"), IM_END]
    client = ScriptedClient([turn1, turn2])
    published = []
    worker = AgentRolloutWorker(
        {"agent_config_path": write_agent_config(tmp_path), "max_response_length": 200},
        client,
        ExactMatchEvaluator(),
        published.append,
    )
    trajectory, evaluation = worker.run_task(make_task())

    # the ChatML layout, written out: the template's rendering, with the closing newline
    # of the model's <|im_end|> line starting the tool turn
    prompt = chatml("<|im_start|>system\nUse the tool.<|im_end|>\n<|im_start|>user\nkey: ab<|im_end|>\n<|im_start|>assistant\n")
    observation = chatml(TOOL_RESULT_42)
    tokens = unpack_int32(trajectory.tokens).tolist()
    mask = unpack_mask(trajectory.loss_mask).tolist()
    assert tokens == prompt + turn1 + observation + turn2
    assert mask == [0] * len(prompt) + [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    # the trained ids are the sampled ids, thinking included, never re-tokenised
    assert [t for t, m in zip(tokens, mask) if m] == turn1 + turn2
    assert encode(TOKENIZER, TOKENIZER.decode(turn1)) != turn1  # a re-tokenising loop would have changed them
    logprobs = unpack_float32(trajectory.logprobs)
    expected = [-0.01 * (i + 1) for i in range(len(turn1))] + [-0.01 * (i + 1) for i in range(len(turn2))]
    np.testing.assert_allclose(logprobs[np.array(mask, bool)], expected, rtol=1e-6)
    assert not logprobs[~np.array(mask, bool)].any()
    # the second call saw exactly the first turn and the observation
    assert client.prompts[1] == prompt + turn1 + observation
    # segments as turns
    assert [(t.role, t.start, t.end, t.trained) for t in trajectory.turns] == [
        ("prompt", 0, len(prompt), False),
        ("assistant", len(prompt), len(prompt) + len(turn1), True),
        ("tool", len(prompt) + len(turn1), len(prompt) + len(turn1) + len(observation), False),
        ("assistant", len(tokens) - len(turn2), len(tokens), True),
    ]
    assert trajectory.turns[1].meta["tool_calls"] == ["lookup"]
    assert trajectory.extra_fields["termination"] == "final_answer"
    assert evaluation.reward == 1.0 and trajectory.weight_version == 3


def test_the_real_engine_trains_exactly_the_tokens_it_sampled(tmp_path):
    model = build_tiny_model(tmp_path / "model", max_positions=512)
    engine = BatchingEngine(EmbeddedEngine(model, seed=3))
    try:
        client = InferenceClient(engine, SamplingParams(max_new_tokens=12, temperature=1.0))
        published = []
        worker = AgentRolloutWorker(
            {
                "agent_config_path": write_agent_config(
                    tmp_path, limits={"max_assistant_turns": 3, "max_total_tokens": 400}, llm_config={"max_tokens": 12}
                )
            },
            client,
            ExactMatchEvaluator(),
            published.append,
        )
        trajectory, _ = worker.run_task(make_task())
        completions = client.recorded()
    finally:
        engine.close()
    assert trajectory.error is None
    tokens, mask = unpack_int32(trajectory.tokens), unpack_mask(trajectory.loss_mask).astype(bool)
    assert tokens[mask].tolist() == [t for c in completions for t in c.response_token_ids]
    np.testing.assert_allclose(
        unpack_float32(trajectory.logprobs)[mask], [lp for c in completions for lp in c.logprobs], rtol=1e-6
    )


def test_tool_errors_are_observations_not_crashes():
    bad_json = [*char_ids("<tool_call>{not json}</tool_call>"), IM_END]
    unknown = [*char_ids('<tool_call>{"name": "nope", "arguments": {}}</tool_call>'), IM_END]
    bad_args = [*char_ids('<tool_call>{"name": "lookup", "arguments": {"key": 7}}</tool_call>'), IM_END]
    raises = [*char_ids('<tool_call>{"name": "fail", "arguments": {"key": "x"}}</tool_call>'), IM_END]
    answer = [*char_ids("done"), IM_END]
    client = ScriptedClient([bad_json, unknown, bad_args, raises, answer])
    episode = run_agent_loop(
        client,
        [{"role": "user", "content": "go"}],
        registry(),
        task=make_task().data,
        limits=AgentLimits(max_assistant_turns=6, max_tokens_per_turn=100, max_total_tokens=4000),
    )
    observations = [s.text for s in episode.segments if s.role == "tool"]
    assert "not valid JSON" in observations[0]
    assert "unknown tool 'nope'" in observations[1]
    assert "invalid arguments for lookup (key)" in observations[2] and "not of type 'string'" in observations[2]
    assert "fail raised RuntimeError: backend down" in observations[3]
    assert episode.termination == "final_answer" and episode.final_answer == "done"
    assert episode.tool_errors == 4 and episode.assistant_turns == 5


def test_limits_end_the_episode_with_their_reason():
    call = [*char_ids('<tool_call>{"name": "lookup", "arguments": {"key": "ab"}}</tool_call>'), IM_END]
    task = make_task().data
    episode = run_agent_loop(
        ScriptedClient([call] * 5),
        [{"role": "user", "content": "q"}],
        registry(),
        task=task,
        limits=AgentLimits(max_assistant_turns=3, max_tokens_per_turn=100, max_total_tokens=4000),
    )
    assert episode.termination == "max_assistant_turns" and episode.assistant_turns == 3 and episode.tool_calls == 3
    # a turn cut off by its token budget
    episode = run_agent_loop(
        ScriptedClient([call]),
        [{"role": "user", "content": "q"}],
        registry(),
        task=task,
        limits=AgentLimits(max_tokens_per_turn=10),
    )
    assert episode.termination == "truncated" and len(episode.segments[-1].tokens) == 10
    # the whole sequence's budget: the observation that would not fit is not appended
    prompt_len = len(RENDERER.prompt_ids([{"role": "user", "content": "q"}], registry().schemas))
    episode = run_agent_loop(
        ScriptedClient([call]),
        [{"role": "user", "content": "q"}],
        registry(),
        task=task,
        limits=AgentLimits(max_tokens_per_turn=100, max_total_tokens=prompt_len + len(call) + 5),
    )
    assert episode.termination == "length" and [s.role for s in episode.segments] == ["prompt", "assistant"]


def test_a_new_phase_is_one_handler_on_the_state_machine():
    """A judge phase after every tool turn (a state of its own, one handler): the judge
    ends the episode once two tools have run, whatever the model would do next."""
    from streamrl.producers.agent_loop import AgentData, AgentLoop, AgentState

    class JudgedLoop(AgentLoop):
        JUDGING = "judging"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.handlers[self.JUDGING] = self.handle_judging  # type: ignore[index]
            self.tool_handler = self.handlers[AgentState.PROCESSING_TOOLS]
            self.handlers[AgentState.PROCESSING_TOOLS] = self.tools_then_judge

        def tools_then_judge(self, data: AgentData):
            return self.JUDGING if self.tool_handler(data) is AgentState.GENERATING else AgentState.TERMINATED

        def handle_judging(self, data: AgentData) -> AgentState:
            data.trace.append({"type": "judge", "turn": data.assistant_turns})
            return self.terminate(data, "judged") if data.tool_calls >= 2 else AgentState.GENERATING

    call = [*char_ids('<tool_call>{"name": "lookup", "arguments": {"key": "ab"}}</tool_call>'), IM_END]
    loop = JudgedLoop(ScriptedClient([call] * 5), registry(), limits=AgentLimits(max_tokens_per_turn=100, max_total_tokens=4000))
    episode = loop.run([{"role": "user", "content": "q"}], make_task().data)
    assert (episode.termination, episode.assistant_turns, episode.tool_calls) == ("judged", 2, 2)
    assert [step["type"] for step in episode.trace] == ["llm", "tool", "judge", "llm", "tool", "judge"]


def test_interaction_adds_user_turns_and_per_turn_rewards():
    class Tutor(ScriptedUser):
        def respond(self, messages, task):
            reply = super().respond(messages, task)
            reply.reward = 0.5 if messages[-1]["content"].startswith("a") else 0.0
            return reply

    client = ScriptedClient([[*char_ids("a1"), IM_END], [*char_ids("b2"), IM_END], [*char_ids("a3"), IM_END]])
    episode = run_agent_loop(
        client,
        [{"role": "user", "content": "start"}],
        interaction=Tutor(),
        task={"user_turns": ["more", "again"]},
        limits=AgentLimits(max_user_turns=5),
    )
    assert [s.role for s in episode.segments] == ["prompt", "assistant", "user", "assistant", "user", "assistant"]
    assert episode.segments[2].tokens == chatml("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
    assert episode.turn_rewards == [0.5, 0.0, 0.5]
    assert episode.termination == "interaction_done" and episode.user_turns == 2
    # max_user_turns stops the conversation
    client = ScriptedClient([[*char_ids("a"), IM_END]] * 3)
    episode = run_agent_loop(
        client,
        [{"role": "user", "content": "s"}],
        interaction=ScriptedUser(),
        task={"user_turns": ["x", "y", "z"]},
        limits=AgentLimits(max_user_turns=1),
    )
    assert episode.termination == "max_user_turns" and episode.user_turns == 1


def test_parse_tool_calls_follows_the_hermes_format():
    parse_tool_calls = parse_hermes
    parsed = parse_tool_calls(
        '<think><tool_call>{"name": "ignored", "arguments": {}}</tool_call></think>'
        'Let me check.<tool_call>\n{"name": "a", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
        '<tool_call>{"name": "b", "arguments": {"y": [1, 2]}}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("a", {"x": 1}), ("b", {"y": [1, 2]})]
    assert parsed.content == "Let me check." and parsed.errors == []
    assert parse_tool_calls('<tool_call>{"name": "a"').errors == ["a <tool_call> was not closed with </tool_call>"]
    assert 'needs a "name"' in parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>').errors[0]


def test_demonstrations_are_laid_out_like_episodes():
    messages = [
        {"role": "user", "content": "key: ab"},
        {"role": "assistant", "content": '<tool_call>{"name":"lookup","arguments":{"key":"ab"}}</tool_call>'},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    tokens, mask = demonstration_tokens(RENDERER, messages)
    call = [*encode(TOKENIZER, messages[1]["content"]), IM_END]
    prompt = chatml("<|im_start|>user\nkey: ab<|im_end|>\n<|im_start|>assistant\n")
    observation = chatml(TOOL_RESULT_42)
    assert tokens == prompt + call + observation + encode(TOKENIZER, "42") + [IM_END]
    assert mask == [0] * len(prompt) + [1] * len(call) + [0] * len(observation) + [1] * 3


def test_bad_agent_and_tool_configs_name_the_file_and_key(tmp_path):
    path = write_agent_config(tmp_path, limits={"max_turns": 3}, temperature=1)
    with pytest.raises(AgentConfigError) as error:
        load_agent_config(path)
    assert (
        "agent.yaml" in str(error.value)
        and "limits.max_turns: unknown key" in str(error.value)
        and "temperature: unknown key" in str(error.value)
    )
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  - callable: tools.py:missing\n    tool_schema: {type: function, function: {name: x}}\n"
    )
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.callable: .*no function 'missing'"):
        ToolRegistry.from_file(tmp_path / "tools.yaml")
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  - callable: tools.py:lookup\n    tool_schema: {type: function, function: {name: x, parameters: {type: 7}}}\n"
    )
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.tool_schema\.function\.parameters: not a valid JSON schema"):
        ToolRegistry.from_file(tmp_path / "tools.yaml")


def test_a_fifteen_turn_episode_is_recorded_turn_by_turn_in_the_ledger(stack, ledger, run_id, tmp_path):
    call = [*char_ids('<tool_call>{"name": "lookup", "arguments": {"key": "ab"}}</tool_call>'), IM_END]
    client = ScriptedClient([call] * 14 + [[*char_ids("42"), IM_END]])
    config = write_agent_config(tmp_path, limits={"max_assistant_turns": 15, "max_total_tokens": 4000})
    create_run_topics(stack, run_id)
    with EventPublisher(stack) as publisher:
        worker = AgentRolloutWorker({"agent_config_path": config}, client, ExactMatchEvaluator(), publisher.publish)
        _trajectory, evaluation = worker.run_task(make_task(run_id=run_id))
    assert evaluation.metrics["assistant_turns"] == 15 and evaluation.metrics["tool_calls"] == 14
    with SinkThread(stack, run_id):
        wait_for(
            lambda: ledger.execute("select count(*) from trajectories where run_id = %s", (run_id,)).fetchone()[0],
            60,
            what="the trajectory in the ledger",
        )
    turns = ledger.execute(
        "select turn_index, role, start_token, end_token, trained, meta from trajectory_turns "
        "where run_id = %s order by turn_index",
        (run_id,),
    ).fetchall()
    assert [r[1] for r in turns] == ["prompt"] + ["assistant", "tool"] * 14 + ["assistant"]
    assert [r[0] for r in turns] == list(range(30))
    assert all(r[4] == (r[1] == "assistant") for r in turns)
    assert all(turns[i][3] == turns[i + 1][2] for i in range(29))  # contiguous spans
    num_tokens, termination = ledger.execute(
        "select num_tokens, extra_fields->>'termination' from trajectories where run_id = %s", (run_id,)
    ).fetchone()
    assert turns[-1][3] == num_tokens and termination == "final_answer"
    assert [r[5]["tool_calls"] for r in turns if r[1] == "assistant"] == [["lookup"]] * 14 + [[]]
    reward = ledger.execute("select reward from evaluations where run_id = %s", (run_id,)).fetchone()[0]
    assert reward == 1.0


def test_per_turn_rewards_are_in_the_ledger_and_turn_credit_uses_them(stack, ledger, run_id, tmp_path):
    """Two episodes of one task with a tutor that rewards an answer starting with "a"
    (0.5 a turn) and an evaluator that wants "42": turn credit gives each assistant turn
    the advantage of the return from it on."""
    from streamrl.consumers.processor import group_outcome
    from streamrl.schema.events import unpack_float32

    (tmp_path / "tutor.py").write_text(
        textwrap.dedent("""
        from streamrl.producers.interaction import InteractionReply, ScriptedUser

        class Tutor(ScriptedUser):
            def respond(self, messages, task):
                reply = super().respond(messages, task)
                reply.reward = 0.5 if messages[-1]["content"].startswith("a") else 0.0
                return reply
    """)
    )
    config = write_agent_config(
        tmp_path,
        interaction={"module_path": "tutor.py:Tutor"},
        limits={"max_assistant_turns": 4, "max_user_turns": 2, "max_total_tokens": 2000},
    )
    scripts = [
        [[*char_ids("a1"), IM_END], [*char_ids("42"), IM_END]],  # 0.5 + 0.0, then right: 1.0
        [[*char_ids("b1"), IM_END], [*char_ids("7"), IM_END]],
    ]  # 0.0 + 0.0, then wrong: 0.0
    create_run_topics(stack, run_id)
    joined = []
    with EventPublisher(stack) as publisher:
        for index, script in enumerate(scripts):
            worker = AgentRolloutWorker(
                {"agent_config_path": config}, ScriptedClient(script), ExactMatchEvaluator(), publisher.publish
            )
            task = msgspec.structs.replace(make_task(run_id=run_id, user_turns=["again"]), task_id=f"t-{index}")
            joined.append(worker.run_task(task))
    assert [e.reward for _, e in joined] == [1.5, 0.0]  # the evaluator's plus the turns'
    with SinkThread(stack, run_id):
        wait_for(
            lambda: ledger.execute("select count(*) from trajectories where run_id = %s", (run_id,)).fetchone()[0] == 2,
            60,
            what="both trajectories in the ledger",
        )
    rewards = dict(
        ledger.execute(
            "select trajectory_id, array_agg(reward order by turn_index) from trajectory_turns "
            "where run_id = %s and role = 'assistant' group by trajectory_id",
            (run_id,),
        ).fetchall()
    )
    assert [rewards[t.trajectory_id] for t, _ in joined] == [[0.5, 0.0], [0.0, 0.0]]
    # turn returns: episode 0 [1.5, 1.0], episode 1 [0, 0]; dr_grpo's baseline is the mean
    # episode return 0.75: advantages [0.75, 0.25] and [-0.75, -0.75]
    samples = group_outcome(run_id, "g-1", 1, 2, joined, "dr_grpo", True, credit_assignment="turn")
    for sample, (trajectory, _), expected in zip(samples, joined, ([0.75, 0.25], [-0.75, -0.75])):
        per_token = unpack_float32(sample.token_advantages)
        spans = [(turn.start, turn.end) for turn in trajectory.turns if turn.role == "assistant"]
        assert [sorted(set(per_token[start:end].tolist())) for start, end in spans] == [[v] for v in expected]


def test_tools_given_as_classes_run_their_execute_or_call_and_anything_else_is_refused(tmp_path):
    (tmp_path / "class_tools.py").write_text(
        textwrap.dedent('''
        class Calculator:
            """Evaluate an arithmetic expression."""
            def execute(self, expression: str) -> str:
                return str(eval(expression, {"__builtins__": {}}))

        class Doubler:
            def __call__(self, value: int) -> int:
                return 2 * value

        class Nothing:
            pass

        LIMIT = 3
    ''')
    )
    tools = ToolRegistry.from_config(
        [{"name": "calculator", "binding": "class_tools.py:Calculator"}, {"name": "double", "binding": "class_tools.py:Doubler"}],
        tmp_path,
    )
    assert tools.call("calculator", {"expression": "6*7"}).output == "42"
    assert tools.call("double", {"value": 21}).output == "42"
    assert tools.tools["calculator"].parameters["required"] == ["expression"]
    with pytest.raises(ToolConfigError, match="the tool class Nothing has neither an execute method nor __call__"):
        ToolRegistry.from_config([{"name": "n", "binding": "class_tools.py:Nothing"}], tmp_path)
    with pytest.raises(ToolConfigError, match="has no function 'LIMIT'"):
        ToolRegistry.from_config([{"name": "n", "binding": "class_tools.py:LIMIT"}], tmp_path)
