"""The multi-turn agent loop: generate -> parse tool calls -> run tools -> append
observations -> repeat, with an interaction for scripted user turns.

Everything is kept as token ids in one growing sequence, segment by segment:

    segment   role        trained  where its tokens come from
    prompt    system/user  no      the model's chat template, with the tool schemas (tools=)
    turn k    assistant    yes     exactly the ids the engine sampled, with their logprobs
    results   tool         no      the template's rendering of the tool messages
    reply     user         no      the template's rendering of the user message

so the trajectory's trained tokens are the sampled ones (no re-tokenisation of the
model's own words; thinking kept), everything else is what the model's own template
renders (runtime/chat_template.py), and every segment is recorded as a Turn. Tool calls
are found in a turn's text by the model family's format (runtime/tool_call_formats.py).

Limits (AgentLimits) and the termination reason each gives:
    max_assistant_turns    "max_assistant_turns"  turns the model takes
    max_user_turns         "max_user_turns"       replies the interaction may add
    max_tool_calls_per_turn                       calls beyond it are answered with an error
    max_tokens_per_turn                           one turn's sampling budget
    max_total_tokens       "length"               the whole sequence (the model's context)
    a turn that hits its budget without stopping  "truncated"
    no tool call and no interaction               "final_answer"
    the interaction says done                     "interaction_done"
"""

from __future__ import annotations

import enum
import hashlib
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamrl.producers.interaction import Interaction
from streamrl.producers.tools import ToolRegistry
from streamrl.runtime.chat_template import ChatRenderer, stop_token_ids
from streamrl.runtime.tool_call_formats import ParsedTurn, tool_call_parser, without_turn_end


class CompletionClient(Protocol):
    tokenizer: Any

    def completion(self, prompt, temperature=None, max_tokens=None, top_p=None, stop_token_ids=()) -> dict: ...


@dataclass
class AgentLimits:
    max_assistant_turns: int = 8
    max_user_turns: int = 0
    max_tool_calls_per_turn: int = 4
    max_tokens_per_turn: int = 64
    max_total_tokens: int = 1024


@dataclass
class Segment:
    role: str  # "prompt" | "assistant" | "tool" | "user"
    tokens: list[int]
    text: str
    logprobs: list[float] | None = None  # sampled segments only
    reward: float | None = None  # per-turn reward from the interaction
    meta: dict[str, Any] = field(default_factory=dict)
    versions: list[int] | None = None  # sampled segments: the weight version of each token

    @property
    def sampled(self) -> bool:
        return self.logprobs is not None


@dataclass
class Episode:
    segments: list[Segment]
    messages: list[dict[str, Any]]  # the chat as text, for evaluators and for reading
    termination: str
    final_answer: str
    assistant_turns: int
    user_turns: int
    tool_calls: int
    tool_errors: int
    weight_versions: list[int]
    trace: list[dict[str, Any]]  # the tracer's steps: llm calls, tool calls, user turns

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.segments for t in s.tokens]

    @property
    def logprobs(self) -> list[float]:
        return [lp for s in self.segments for lp in (s.logprobs or [0.0] * len(s.tokens))]

    @property
    def token_versions(self) -> list[int]:
        return [v for s in self.segments for v in (s.versions or [0] * len(s.tokens))]

    @property
    def turn_rewards(self) -> list[float]:
        return [s.reward for s in self.segments if s.reward is not None]


class AgentState(enum.Enum):
    """The phases of an episode (verl's `ToolAgentLoop` names them the same): each has one
    handler on `AgentLoop`, which does the phase's work and returns the next state."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    INTERACTING = "interacting"
    TERMINATED = "terminated"


@dataclass
class AgentData:
    """An episode in progress: what the handlers read and append to."""

    messages: list[dict[str, Any]]  # the opening messages
    task: dict[str, Any]
    schemas: list[dict] | None = None
    segments: list[Segment] = field(default_factory=list)
    chat: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    termination: str = "max_assistant_turns"
    final_answer: str = ""
    response: list[int] = field(default_factory=list)  # the last assistant turn's sampled ids
    parsed: ParsedTurn | None = None  # and the calls found in it

    def used(self) -> int:
        return sum(len(s.tokens) for s in self.segments)

    def episode(self) -> Episode:
        return Episode(
            segments=self.segments,
            messages=self.chat,
            termination=self.termination,
            final_answer=self.final_answer,
            assistant_turns=self.assistant_turns,
            user_turns=self.user_turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            weight_versions=self.versions,
            trace=self.trace,
        )


class AgentLoop:
    """One episode as a state machine: PENDING (render the prompt) -> GENERATING (sample a
    turn) -> PROCESSING_TOOLS (run its calls) or INTERACTING (the scripted user's reply)
    -> GENERATING ... -> TERMINATED. A new phase (a reflection step, a judge turn) is one
    more handler: a subclass overrides `next_after_turn` or a handler, and may add states
    to `handlers`."""

    def __init__(
        self,
        client: CompletionClient,
        tools: ToolRegistry | None = None,
        interaction: Interaction | None = None,
        limits: AgentLimits | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        parse: Callable[[str], ParsedTurn] | None = None,
        list_tools: bool = True,
    ):
        self.client, self.tokenizer = client, client.tokenizer
        self.renderer: ChatRenderer = getattr(client, "chat", None) or ChatRenderer(self.tokenizer)
        self.parse = parse or tool_call_parser("auto", self.renderer.template)
        self.stops = stop_token_ids(self.tokenizer)
        self.tools, self.interaction = tools or ToolRegistry([]), interaction
        self.limits, self.temperature, self.top_p, self.list_tools = limits or AgentLimits(), temperature, top_p, list_tools
        self.handlers: dict[AgentState, Callable[[AgentData], AgentState]] = {
            AgentState.PENDING: self.handle_pending,
            AgentState.GENERATING: self.handle_generating,
            AgentState.PROCESSING_TOOLS: self.handle_processing_tools,
            AgentState.INTERACTING: self.handle_interacting,
        }

    def run(self, messages: list[dict[str, Any]], task: dict[str, Any] | None = None) -> Episode:
        data, state = AgentData(messages=messages, task=task or {}), AgentState.PENDING
        try:
            while state is not AgentState.TERMINATED:
                state = self.handlers[state](data)
        finally:
            if self.interaction is not None and data.segments:  # it was started
                self.interaction.finish(data.task)
        return data.episode()

    def handle_pending(self, data: AgentData) -> AgentState:
        """The opening messages, rendered with the tool schemas."""
        data.schemas = self.tools.schemas if self.list_tools and self.tools.tools else None
        prompt_text = self.renderer.prompt_text(data.messages, data.schemas)
        prompt_ids = self.renderer.prompt_ids(data.messages, data.schemas)
        if len(prompt_ids) >= self.limits.max_total_tokens:  # nothing could be sampled: a failed rollout, said
            raise ValueError(
                f"the agent's prompt is {len(prompt_ids)} tokens, and max_total_tokens (max_context_tokens) is "
                f"{self.limits.max_total_tokens}: no turn fits"
            )
        data.segments.append(Segment("prompt", prompt_ids, prompt_text))
        data.chat = [dict(m) for m in data.messages]
        if self.interaction is not None:
            self.interaction.start(data.task)
        return AgentState.GENERATING

    def handle_generating(self, data: AgentData, check_turns: bool = True) -> AgentState:
        """One assistant turn, sampled within its budget; the ids stay as sampled.
        `check_turns=False` leaves max_assistant_turns to a subclass's own stop rule."""
        limits = self.limits
        if check_turns and data.assistant_turns >= limits.max_assistant_turns:
            return self.terminate(data, "max_assistant_turns")
        budget = min(limits.max_tokens_per_turn, limits.max_total_tokens - data.used())
        if budget <= 0:
            return self.terminate(data, "length")
        started = time.perf_counter()
        sequence = [t for s in data.segments for t in s.tokens]
        result = self.client.completion(
            sequence, temperature=self.temperature, max_tokens=budget, top_p=self.top_p, stop_token_ids=self.stops
        )
        data.assistant_turns += 1
        data.response = list(result["response_tokens"])
        text = self.tokenizer.decode(data.response, skip_special_tokens=False)
        data.versions.append(int(result.get("weight_version", 0)))
        data.parsed = self.parse(text)
        version = data.versions[-1]
        meta = {"finish_reason": result["finish_reason"], "weight_version": version}
        meta["tool_calls"] = [c.name for c in data.parsed.tool_calls]
        versions = list(result.get("token_versions") or [version] * len(data.response))
        data.segments.append(Segment("assistant", data.response, text, list(result["logprobs"]), meta=meta, versions=versions))
        data.chat.append({"role": "assistant", "content": without_turn_end(text)})
        data.trace.append(
            {
                "type": "llm",
                "turn": data.assistant_turns,
                "prompt_tokens": data.used() - len(data.response),
                "response_tokens": len(data.response),
                "finish_reason": result["finish_reason"],
                "seconds": round(time.perf_counter() - started, 4),
            }
        )
        data.final_answer = data.parsed.content
        if result["finish_reason"] == "length":  # cut off mid-turn: nothing after it would be well formed
            return self.terminate(data, "truncated")
        return self.next_after_turn(data)

    def next_after_turn(self, data: AgentData) -> AgentState:
        """Tool calls are run; without any, the interaction replies, or the episode ends."""
        assert data.parsed is not None
        if data.parsed.tool_calls or data.parsed.errors:
            return AgentState.PROCESSING_TOOLS
        if self.interaction is None:
            return self.terminate(data, "final_answer")
        return AgentState.INTERACTING

    def handle_processing_tools(self, data: AgentData) -> AgentState:
        """The turn's calls (at most max_tool_calls_per_turn), their results rendered as
        the template renders tool messages, each with its call's id."""
        parsed, limits = data.parsed, self.limits
        assert parsed is not None
        outputs = [f"error: {e}" for e in parsed.errors]
        data.tool_errors += len(parsed.errors)
        for i, call in enumerate(parsed.tool_calls):
            if i >= limits.max_tool_calls_per_turn:
                outputs.append(f"error: more than {limits.max_tool_calls_per_turn} tool calls in one turn")
                data.tool_errors += 1
                continue
            outcome = self.tools.call(call.name, call.arguments, data.task)
            data.tool_calls += 1
            data.tool_errors += not outcome.ok
            outputs.append(outcome.output)
            data.trace.append(
                {
                    "type": "tool",
                    "turn": data.assistant_turns,
                    "name": call.name,
                    "arguments": call.arguments,
                    "ok": outcome.ok,
                    "output": outcome.output[:500],
                    "seconds": round(outcome.seconds, 4),
                    **outcome.extra,
                }
            )
        ids = call_ids(parsed, f"{data.task.get('task_id', '')}/{data.assistant_turns}")
        results = [{"role": "tool", "content": output, "tool_call_id": id_} for output, id_ in zip(outputs, ids)]
        observation, observation_tokens = self.renderer.continuation(data.chat, results, data.response, data.schemas)
        if data.used() + len(observation_tokens) > limits.max_total_tokens:
            return self.terminate(data, "length")  # the observation would not fit: end on the assistant's turn
        meta = {"tools": [c.name for c in parsed.tool_calls], "tool_call_ids": ids}
        data.segments.append(Segment("tool", observation_tokens, observation, meta=meta))
        data.chat += results
        return AgentState.GENERATING

    def handle_interacting(self, data: AgentData) -> AgentState:
        """The interaction scores the turn and replies as the user, or ends the episode."""
        assert self.interaction is not None
        reply = self.interaction.respond(data.chat, data.task)
        data.segments[-1].reward = float(reply.reward)
        data.trace.append(
            {
                "type": "interaction",
                "turn": data.assistant_turns,
                "done": reply.done,
                "reward": float(reply.reward),
                "reply": (reply.reply or "")[:500],
            }
        )
        if reply.done:
            return self.terminate(data, "interaction_done")
        if data.user_turns >= self.limits.max_user_turns:
            return self.terminate(data, "max_user_turns")
        user_message = {"role": "user", "content": reply.reply or ""}
        turn_text, turn_tokens = self.renderer.continuation(data.chat, [user_message], data.response, data.schemas)
        if data.used() + len(turn_tokens) > self.limits.max_total_tokens:
            return self.terminate(data, "length")
        data.user_turns += 1
        data.segments.append(Segment("user", turn_tokens, turn_text, meta=dict(reply.meta or {})))
        data.chat.append(user_message)
        return AgentState.GENERATING

    @staticmethod
    def terminate(data: AgentData, why: str) -> AgentState:
        data.termination = why
        return AgentState.TERMINATED


def run_agent_loop(
    client: CompletionClient,
    messages: list[dict[str, str]],
    tools: ToolRegistry | None = None,
    interaction: Interaction | None = None,
    task: dict[str, Any] | None = None,
    limits: AgentLimits | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    parse: Callable[[str], ParsedTurn] | None = None,
    list_tools: bool = True,
) -> Episode:
    """Run one episode from the opening `messages` (system/few-shot/user). The client's
    `chat` renderer lays out every turn but the model's; `parse` finds tool calls (the
    template's family's format by default); `list_tools` gives the template the schemas."""
    return AgentLoop(client, tools, interaction, limits, temperature, top_p, parse, list_tools).run(messages, task)


ID_ALPHABET = string.ascii_letters + string.digits


def call_ids(parsed: ParsedTurn, seed: str) -> list[str]:
    """One id per tool result, in `outputs` order (the parse errors' first, then the
    calls'): the id the model wrote with its call, else nine alphanumerics (the form
    Mistral's templates require; the others take any string) derived from the task,
    the turn and the position, so a re-render of the episode gives the same ids."""
    written = [None] * len(parsed.errors) + [call.call_id for call in parsed.tool_calls]
    return [given or made_id(f"{seed}/{index}") for index, given in enumerate(written)]


def made_id(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(ID_ALPHABET[byte % len(ID_ALPHABET)] for byte in digest[:9])


def episode_turns(episode: Episode, loss_mask: list[int]) -> list[dict[str, Any]]:
    """The segments as Turn records (start/end offsets into the token sequence)."""
    turns, start = [], 0
    for segment in episode.segments:
        end = start + len(segment.tokens)
        turns.append(
            {
                "role": segment.role,
                "start": start,
                "end": end,
                "trained": any(loss_mask[start:end]),
                "reward": segment.reward,
                "meta": segment.meta,
            }
        )
        start = end
    return turns
