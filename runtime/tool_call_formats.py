"""Tool-call formats: how each model family writes a tool call in its sampled text.

A format is a parser, `parse(text) -> ParsedTurn`, registered by name; the agent
config's `tool_call_format` picks one (`auto`: from the chat template's own markers).
The tool schemas reach the prompt through the chat template (`tools=`), which lists
them as its family expects. A malformed call becomes an error the model is shown, in
the tool results, never an exception.

    hermes       Qwen 2.5 / Qwen 3 / Hermes:  <tool_call>{"name": ..., "arguments": {...}}</tool_call>
                 (one element per call, anywhere outside a <think> block)
    llama3_json  Llama 3.1 - 3.3:  the turn is {"name": ..., "parameters": {...}} (optionally after
                 <|python_tag|>), several calls separated by ";", prose after them kept; and
                 Llama's other official forms, <function=name>{...}</function> and the
                 pythonic [name(key="value"), ...] (Llama 3.2 / 4)
    mistral      Mistral (v3 tokenizer):  [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]

A recipe's own: `tool_call_format: my_parsers.py:parse` (a function of the same shape).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamrl.runtime.plugins import load_function
from streamrl.runtime.registry import Registry


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str | None = None  # the id the model wrote with the call (Mistral's "id"), if any


@dataclass
class ParsedTurn:
    """An assistant turn's text split into what the agent loop acts on."""

    content: str  # the text without thinking and tool calls: the answer, if this is the last turn
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # malformed calls, reported back to the model


TOOL_CALL_FORMATS: Registry[Callable[[str], ParsedTurn]] = Registry("tool-call format", None)
register_tool_call_format = TOOL_CALL_FORMATS.register

THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
# special tokens a decoded turn may end with (decoding keeps them: tags must survive)
TURN_END_TEXT = re.compile(r"(<\|im_end\|>|<\|eot_id\|>|<\|eom_id\|>|</s>|<\|endoftext\|>|<\|end_of_text\|>)\s*$")


def strip_thinking(text: str) -> str:
    return THINK_RE.sub("", text)


def without_turn_end(text: str) -> str:
    """A decoded turn without the special token that closed it."""
    return TURN_END_TEXT.sub("", text)


def visible_text(text: str) -> str:
    return without_turn_end(strip_thinking(text))


def call_from_json(payload: Any, body: str, arguments_key: str = "arguments") -> ToolCall | str:
    """A ToolCall from a decoded JSON object, or why it is not one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return f'tool call needs a "name" string: {body[:200]}'
    arguments = payload.get(arguments_key, payload.get("arguments", {}))
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return f'tool call "{payload["name"]}": "{arguments_key}" must be an object, got {arguments!r:.100}'
    call_id = payload.get("id")
    return ToolCall(payload["name"], arguments, call_id if isinstance(call_id, str) and call_id else None)


def _add(parsed: ParsedTurn, outcome: ToolCall | str) -> None:
    if isinstance(outcome, ToolCall):
        parsed.tool_calls.append(outcome)
    else:
        parsed.errors.append(outcome)


def _json(body: str) -> tuple[Any, str | None]:
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"tool call is not valid JSON ({exc.msg} at character {exc.pos}): {body[:200]}"


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


@register_tool_call_format("hermes")
def parse_hermes(text: str) -> ParsedTurn:
    """Each <tool_call> element's JSON is decoded where it starts, so a "</tool_call>"
    inside a string argument does not end the call; the element must close after it."""
    visible = visible_text(text)
    parsed, kept, position = ParsedTurn(""), [], 0
    decoder = json.JSONDecoder()
    while (start := visible.find(HERMES_OPEN, position)) >= 0:
        kept.append(visible[position:start])
        body_start = start + len(HERMES_OPEN)
        body_start += len(visible[body_start:]) - len(visible[body_start:].lstrip())
        try:
            payload, body_end = decoder.raw_decode(visible, body_start)
        except json.JSONDecodeError:
            payload, body_end = None, visible.find(HERMES_CLOSE, body_start)
        close = visible.find(HERMES_CLOSE, body_end if body_end >= 0 else body_start)
        if close < 0:
            parsed.errors.append("a <tool_call> was not closed with </tool_call>")
            position = len(visible)
            break
        body = visible[body_start:close].strip()
        if payload is None or visible[body_end:close].strip():
            _add(parsed, _json(body)[1] or f"tool call is not one JSON object: {body[:200]}")
        else:
            _add(parsed, call_from_json(payload, body))
        position = close + len(HERMES_CLOSE)
    parsed.content = ("".join(kept) + visible[position:]).strip()
    return parsed


# Llama's other official forms (llama-models' ToolPromptFormat): function_tag and python_list
FUNCTION_TAG = re.compile(r"<function=([A-Za-z0-9_.\-]+)>(.*?)</function>", re.DOTALL)


@register_tool_call_format("llama3_json")
def parse_llama3_json(text: str) -> ParsedTurn:
    """A turn that is a JSON call (or several, ";"-separated) is a tool call, and prose
    after the last call is kept as the turn's content; so are Llama's `<function=name>
    {...}</function>` elements and a pythonic list `[f(a=1), g(b="x")]`. A turn of prose
    is the answer. A turn that starts like JSON but does not parse is malformed."""
    visible = visible_text(text).strip()
    tagged = visible.startswith("<|python_tag|>")
    visible = visible.removeprefix("<|python_tag|>").strip()
    if FUNCTION_TAG.search(visible):
        return parse_function_tags(visible)
    if visible.startswith("[") and (pythonic := parse_pythonic(visible)) is not None:
        return pythonic
    if not (tagged or visible.startswith("{")):
        return ParsedTurn(visible)
    parsed = ParsedTurn("")
    decoder = json.JSONDecoder()
    position = 0
    while position < len(visible):
        try:
            payload, end = decoder.raw_decode(visible, position)
        except json.JSONDecodeError as exc:
            parsed.errors.append(
                f"tool call is not valid JSON ({exc.msg} at character {exc.pos}): {visible[position : position + 200]}"
            )
            break
        _add(parsed, call_from_json(payload, visible[position:end], arguments_key="parameters"))
        rest = visible[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif not rest.startswith("{"):  # prose after the calls: what the model says beside them
            parsed.content = rest
            break
        position = len(visible) - len(rest)
    return parsed


def parse_function_tags(visible: str) -> ParsedTurn:
    parsed = ParsedTurn(FUNCTION_TAG.sub("", visible).strip())
    for name, body in FUNCTION_TAG.findall(visible):
        payload, error = _json(body.strip() or "{}")
        _add(parsed, error or call_from_json({"name": name, "arguments": payload}, body.strip()))
    return parsed


def parse_pythonic(visible: str) -> ParsedTurn | None:
    """`[name(key=literal, ...), ...]` as calls, or None when the text is not such a list
    (a final answer like "[1, 2]" stays prose)."""
    try:
        tree = ast.parse(visible, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    if not all(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and not c.args for c in tree.elts):
        return None
    parsed = ParsedTurn("")
    for call in tree.elts:
        name = call.func.id  # type: ignore[attr-defined]  # checked above
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}  # type: ignore[attr-defined]
        except ValueError:
            parsed.errors.append(f'tool call "{name}": arguments must be literals: {ast.unparse(call)[:200]}')
            continue
        parsed.tool_calls.append(ToolCall(name, arguments))
    return parsed


MISTRAL_MARK = "[TOOL_CALLS]"


@register_tool_call_format("mistral")
def parse_mistral(text: str) -> ParsedTurn:
    visible = visible_text(text)
    if MISTRAL_MARK not in visible:
        return ParsedTurn(visible.strip())
    content, _, body = visible.partition(MISTRAL_MARK)
    parsed = ParsedTurn(content.strip())
    payload, error = _json(body.strip())
    if error:
        parsed.errors.append(error)
    elif not isinstance(payload, list):
        parsed.errors.append(f"{MISTRAL_MARK} must be followed by a JSON list of calls: {body.strip()[:200]}")
    else:
        for call in payload:
            _add(parsed, call_from_json(call, json.dumps(call)))
    return parsed


# The markers a chat template's text shows its family by (`tool_call_format: auto`).
TEMPLATE_MARKERS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|start_header_id|>", "llama3_json"))


def detect_format(chat_template: str | None) -> str:
    for marker, name in TEMPLATE_MARKERS:
        if chat_template and marker in chat_template:
            return name
    return "hermes"  # the format most open tool-calling models were tuned on


def tool_call_parser(name: str, chat_template: str | None, base_dir: str = ".") -> Callable[[str], ParsedTurn]:
    """The parser `name` (a registered format, `auto`, or `file.py:function`) stands for."""
    if name == "auto":
        name = detect_format(chat_template)
    if ":" in name:
        parser: Callable[[str], ParsedTurn] = load_function(name, base_dir)  # type: ignore[assignment]  # the user's parser
        return parser
    return TOOL_CALL_FORMATS.get(name)
