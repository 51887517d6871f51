"""Chat rendering and tool-call parsing for multi-turn rollouts, at the token level.

Format: ChatML, as Qwen-family models use it.

    <|im_start|>system\\n{system prompt}<|im_end|>\\n
    <|im_start|>user\\n{question}<|im_end|>\\n
    <|im_start|>assistant\\n{sampled tokens ... <|im_end|>}
    \\n<|im_start|>user\\n<tool_response>\\n{result}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n{sampled tokens ... <|im_end|>}

Only the text around the model's turns is ever tokenised here; what the model says
stays as the token ids it sampled (token-in/token-out): decoding a turn and encoding
it again can give other ids, and the learner must score exactly the sampled ones.

Tool calls use the Hermes / Qwen convention: a JSON object with `name` and `arguments`
between <tool_call> and </tool_call>, one per call, anywhere in the assistant's turn
outside a <think>...</think> block:

    <tool_call>{"name": "lookup", "arguments": {"key": "apple"}}</tool_call>
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
UNCLOSED_TOOL_CALL_RE = re.compile(r"<tool_call>(?!.*</tool_call>)", re.DOTALL)
THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """An assistant turn's text split into what the agent loop acts on."""

    content: str  # the text without thinking and tool calls: the answer, if this is the last turn
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # malformed calls, reported back to the model


def strip_thinking(text: str) -> str:
    return THINK_RE.sub("", text)


def parse_tool_calls(text: str) -> ParsedTurn:
    """The tool calls of an assistant turn (outside thinking), and what is left of it."""
    visible = strip_thinking(text)
    calls, errors = [], []
    for match in TOOL_CALL_RE.finditer(visible):
        body = match.group(1).strip()
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call is not valid JSON ({exc.msg} at character {exc.pos}): {body[:200]}")
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            errors.append(f'tool call needs a "name" string: {body[:200]}')
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some models send the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            errors.append(f'tool call "{payload["name"]}": "arguments" must be an object, got {arguments!r:.100}')
            continue
        calls.append(ToolCall(payload["name"], arguments))
    if UNCLOSED_TOOL_CALL_RE.search(visible):
        errors.append("a <tool_call> was not closed with </tool_call>")
    content = UNCLOSED_TOOL_CALL_RE.split(TOOL_CALL_RE.sub("", visible))[0].replace(IM_END, "").strip()
    return ParsedTurn(content, calls, errors)


def tools_system_text(tool_schemas: list[dict]) -> str:
    """The tool list as Qwen's chat template puts it into the system prompt."""
    listing = "\n".join(json.dumps(schema, separators=(",", ":")) for schema in tool_schemas)
    return ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call>")


def render_message(role: str, content: str) -> str:
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def render_prompt(messages: list[dict[str, str]]) -> str:
    """The opening messages (system, few-shot, user) and the first assistant header."""
    return "".join(render_message(m["role"], m["content"]) for m in messages) + f"{IM_START}assistant\n"


def render_tool_results(results: list[str]) -> str:
    """What follows an assistant turn that called tools, up to the next assistant header.
    It starts with the newline that closes the assistant's <|im_end|> line."""
    body = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return "\n" + render_message("user", body) + f"{IM_START}assistant\n"


def render_user_turn(content: str) -> str:
    return "\n" + render_message("user", content) + f"{IM_START}assistant\n"


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(tokenizer) -> list[int]:
    """The ids that end an assistant turn: <|im_end|> where the tokenizer has it, and EOS."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    if im_end is not None and im_end != tokenizer.unk_token_id:
        ids.append(im_end)
    return ids


def demonstration_tokens(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """A worked episode (system/user..., then assistant, tool and user turns) as the agent
    loop would lay it out, with the loss mask on the assistant turns and their <|im_end|>:
    what a supervised warm-up trains on."""
    first_assistant = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first_assistant is None:
        raise ValueError("a demonstration needs at least one assistant message")
    tokens = encode(tokenizer, render_prompt(messages[:first_assistant]))
    mask = [0] * len(tokens)
    end_ids = stop_token_ids(tokenizer)
    turn_end = end_ids[-1] if end_ids else None  # <|im_end|> where the tokenizer has it, else EOS
    for message in messages[first_assistant:]:
        if message["role"] == "assistant":
            spoken = encode(tokenizer, message["content"]) + ([turn_end] if turn_end is not None else [])
            tokens += spoken
            mask += [1] * len(spoken)
            continue
        if message["role"] == "tool":
            text = render_tool_results([message["content"]])
        elif message["role"] == "user":
            text = render_user_turn(message["content"])
        else:
            raise ValueError(f"a demonstration turn after the first assistant message must be assistant, tool "
                             f"or user, got {message['role']!r}")
        rendered = encode(tokenizer, text)
        tokens += rendered
        mask += [0] * len(rendered)
    return tokens, mask
