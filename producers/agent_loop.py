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
    limits = limits or AgentLimits()
    task = task or {}
    tokenizer = client.tokenizer
    renderer: ChatRenderer = getattr(client, "chat", None) or ChatRenderer(tokenizer)
    parse = parse or tool_call_parser("auto", renderer.template)
    stops = stop_token_ids(tokenizer)
    tools = tools or ToolRegistry([])
    schemas = tools.schemas if list_tools and tools.tools else None
    prompt_text = renderer.prompt_text(messages, schemas)
    segments = [Segment("prompt", renderer.prompt_ids(messages, schemas), prompt_text)]
    chat = [dict(m) for m in messages]
    trace: list[dict[str, Any]] = []
    versions: list[int] = []
    assistant_turns = user_turns = calls_made = tool_errors = 0
    termination, final_answer = "max_assistant_turns", ""
    if interaction is not None:
        interaction.start(task)

    def used() -> int:
        return sum(len(s.tokens) for s in segments)

    while assistant_turns < limits.max_assistant_turns:
        budget = min(limits.max_tokens_per_turn, limits.max_total_tokens - used())
        if budget <= 0:
            termination = "length"
            break
        started = time.perf_counter()
        result = client.completion(
            [t for s in segments for t in s.tokens], temperature=temperature, max_tokens=budget, top_p=top_p, stop_token_ids=stops
        )
        assistant_turns += 1
        response = list(result["response_tokens"])
        text = tokenizer.decode(response, skip_special_tokens=False)
        versions.append(int(result.get("weight_version", 0)))
        parsed = parse(text)
        segments.append(
            Segment(
                "assistant",
                response,
                text,
                logprobs=list(result["logprobs"]),
                versions=list(result.get("token_versions") or [versions[-1]] * len(response)),
                meta={
                    "finish_reason": result["finish_reason"],
                    "weight_version": versions[-1],
                    "tool_calls": [c.name for c in parsed.tool_calls],
                },
            )
        )
        chat.append({"role": "assistant", "content": without_turn_end(text)})
        trace.append(
            {
                "type": "llm",
                "turn": assistant_turns,
                "prompt_tokens": used() - len(response),
                "response_tokens": len(response),
                "finish_reason": result["finish_reason"],
                "seconds": round(time.perf_counter() - started, 4),
            }
        )
        final_answer = parsed.content
        if result["finish_reason"] == "length":  # cut off mid-turn: nothing after it would be well formed
            termination = "truncated"
            break

        if parsed.tool_calls or parsed.errors:
            outputs = [f"error: {e}" for e in parsed.errors]
            tool_errors += len(parsed.errors)
            for i, call in enumerate(parsed.tool_calls):
                if i >= limits.max_tool_calls_per_turn:
                    outputs.append(f"error: more than {limits.max_tool_calls_per_turn} tool calls in one turn")
                    tool_errors += 1
                    continue
                outcome = tools.call(call.name, call.arguments, task)
                calls_made += 1
                tool_errors += not outcome.ok
                outputs.append(outcome.output)
                trace.append(
                    {
                        "type": "tool",
                        "turn": assistant_turns,
                        "name": call.name,
                        "arguments": call.arguments,
                        "ok": outcome.ok,
                        "output": outcome.output[:500],
                        "seconds": round(outcome.seconds, 4),
                    }
                )
            ids = call_ids(parsed, f"{task.get('task_id', '')}/{assistant_turns}")
            results = [{"role": "tool", "content": output, "tool_call_id": id_} for output, id_ in zip(outputs, ids)]
            observation, observation_tokens = renderer.continuation(chat, results, response, schemas)
            if used() + len(observation_tokens) > limits.max_total_tokens:
                termination = "length"  # the observation would not fit: end on the assistant's turn
                break
            meta = {"tools": [c.name for c in parsed.tool_calls], "tool_call_ids": ids}
            segments.append(Segment("tool", observation_tokens, observation, meta=meta))
            chat += results
            continue

        if interaction is None:
            termination = "final_answer"
            break
        reply = interaction.respond(chat, task)
        segments[-1].reward = float(reply.reward)
        trace.append(
            {
                "type": "interaction",
                "turn": assistant_turns,
                "done": reply.done,
                "reward": float(reply.reward),
                "reply": (reply.reply or "")[:500],
            }
        )
        if reply.done:
            termination = "interaction_done"
            break
        if user_turns >= limits.max_user_turns:
            termination = "max_user_turns"
            break
        user_message = {"role": "user", "content": reply.reply or ""}
        turn_text, turn_tokens = renderer.continuation(chat, [user_message], response, schemas)
        if used() + len(turn_tokens) > limits.max_total_tokens:
            termination = "length"
            break
        user_turns += 1
        segments.append(Segment("user", turn_tokens, turn_text, meta=dict(reply.meta or {})))
        chat.append(user_message)

    return Episode(
        segments=segments,
        messages=chat,
        termination=termination,
        final_answer=final_answer,
        assistant_turns=assistant_turns,
        user_turns=user_turns,
        tool_calls=calls_made,
        tool_errors=tool_errors,
        weight_versions=versions,
        trace=trace,
    )


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
