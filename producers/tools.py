"""The tool registry of agent rollouts: tools described by JSON schemas (OpenAI function
format, as verl's tool configs write them), bound to Python callables.

A tool config (YAML or JSON):

    tools:
      - callable: "agent_workspace/kv_tools.py:lookup"   # or a dotted module: "math:sqrt"
        tool_schema:
          type: function
          function:
            name: lookup
            description: The value stored under a key.
            parameters:
              type: object
              properties: {key: {type: string}}
              required: [key]

A call's arguments are checked against `parameters` (jsonschema) before the function
runs; a bad call, an exception or an over-long result becomes the observation the
model reads (an "error: ..." text), never a crashed rollout. Functions receive the
task's row as `task` when they declare that parameter (per-task state: a hidden
database, the expected answer, ...).
"""

from __future__ import annotations

import importlib
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from streamrl.producers.verl_tools import ToolOutput, load_object, verl_tool_function
from streamrl.runtime.plugins import LoadError, load_module


def jsonschema_module():
    """jsonschema, imported when a tool config is read (the `agents` extra brings it)."""
    from streamrl.runtime.extras import missing_extra

    try:
        import jsonschema
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, "an agent's tool arguments check") or exc from None
    return jsonschema


class ToolConfigError(ValueError):
    pass


@dataclass
class Tool:
    name: str
    schema: dict  # the whole {"type": "function", "function": {...}} object
    function: Callable[..., Any]

    @property
    def parameters(self) -> dict:
        return self.schema["function"].get("parameters", {"type": "object", "properties": {}})

    @property
    def wants_task(self) -> bool:
        return "task" in inspect.signature(self.function).parameters


@dataclass
class ToolResult:
    name: str
    arguments: dict
    output: str
    ok: bool
    seconds: float
    extra: dict = field(default_factory=dict)  # a verl tool's step reward and metrics


def load_callable(spec: str, base_dir: Path) -> Callable[..., Any]:
    """ "path/to/file.py:function" (relative to base_dir) or "dotted.module:function"."""
    module_text, sep, name = spec.rpartition(":")
    if not sep or not module_text or not name:
        raise LoadError(f"{spec!r}: expected 'module:function' or 'path/to/file.py:function'")
    if module_text.endswith(".py"):
        module = load_module(base_dir / module_text, spec)
    else:
        try:
            module = importlib.import_module(module_text)
        except ImportError as exc:
            raise LoadError(f"{spec!r}: cannot import {module_text}: {exc}") from exc
    target = getattr(module, name, None)
    if inspect.isclass(target):  # the guide's class form: an instance's execute (or __call__) is the tool
        return tool_method(target, spec)
    if not callable(target):
        raise LoadError(f"{spec!r}: {module_text} has no function {name!r}")
    return target


def tool_method(cls: type, spec: str) -> Callable[..., Any]:
    """A tool class, instantiated without arguments: its `execute` method, or the
    instance itself when the class defines `__call__`."""
    try:
        instance = cls()
    except TypeError as exc:
        raise LoadError(f"{spec!r}: the tool class {cls.__name__} must be constructible without arguments ({exc})") from None
    method = getattr(instance, "execute", None)
    if callable(method):
        return method
    if callable(instance):
        return instance.__call__
    raise LoadError(f"{spec!r}: the tool class {cls.__name__} has neither an execute method nor __call__")


JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array", "dict": "object"}


def schema_from_function(name: str, description: str | None, function: Callable[..., Any]) -> dict:
    """An OpenAI function schema from a Python function's signature: each parameter (but
    `task`, which the registry passes itself) with its annotated JSON type (string when
    unannotated); parameters without a default are required."""
    properties, required = {}, []
    hints = getattr(function, "__annotations__", {})
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "task" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = hints.get(parameter.name, "str")  # a class, or its name under `from __future__ import annotations`
        properties[parameter.name] = {"type": JSON_TYPES.get(getattr(annotation, "__name__", str(annotation)), "string")}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description or (inspect.getdoc(function) or "").split("\n")[0],
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def verl_tool(entry: dict, where: str, base_dir: Path) -> Tool:
    """A tool in verl's shape: its class built with (config, tool_schema), called by
    create, execute and release (producers/verl_tools.py). `class_name` is a dotted path,
    imported with the config's folder and its parent on sys.path (verl's `module.Class`
    beside the file, or `package.module.Class` from the folder above)."""
    unknown = set(entry) - {"class_name", "config", "tool_schema"}
    if unknown:
        raise ToolConfigError(f"{where}: unknown key(s) {sorted(unknown)} (a verl tool has class_name, config, tool_schema)")
    schema = entry.get("tool_schema")
    if not isinstance(schema, dict) or not (schema.get("function") or {}).get("name"):
        raise ToolConfigError(f"{where}.tool_schema.function.name: required")
    try:
        cls = load_object(entry["class_name"], f"{where}.class_name", base_dir)
        instance = cls(dict(entry.get("config") or {}), schema)
    except Exception as exc:  # an import error, a constructor that refuses its config
        raise ToolConfigError(f"{where}: {exc}") from None
    return Tool(schema["function"]["name"], schema, verl_tool_function(instance))


class ToolRegistry:
    def __init__(self, tools: list[Tool], max_output_chars: int = 2000):
        self.tools = {tool.name: tool for tool in tools}
        self.max_output_chars = max_output_chars

    @classmethod
    def from_config(
        cls, entries: list[dict], base_dir: Path, source: str = "tools", max_output_chars: int = 2000
    ) -> ToolRegistry:
        tools = []
        for i, entry in enumerate(entries or []):
            where = f"{source}[{i}]"
            if not isinstance(entry, dict):
                raise ToolConfigError(f"{where}: expected a mapping with callable and tool_schema")
            if "class_name" in entry:  # verl's form: class_name, config, tool_schema (a BaseTool)
                tools.append(verl_tool(entry, where, Path(base_dir)))
                continue
            if "binding" in entry:  # the guide's form: name, binding, description
                unknown = set(entry) - {"name", "binding", "description"}
                if unknown:
                    raise ToolConfigError(
                        f"{where}: unknown key(s) {sorted(unknown)} (a `binding:` tool has name, binding, description)"
                    )
                try:
                    function = load_callable(str(entry["binding"]), base_dir)
                except LoadError as exc:
                    raise ToolConfigError(f"{where}.binding: {exc}") from None
                name = entry.get("name") or getattr(function, "__name__", None) or str(entry["binding"])
                tools.append(Tool(name, schema_from_function(name, entry.get("description"), function), function))
                continue
            unknown = set(entry) - {"callable", "tool_schema"}
            if unknown:
                raise ToolConfigError(
                    f"{where}: unknown key(s) {sorted(unknown)} (expected callable and "
                    "tool_schema, or name, binding and description)"
                )
            schema = entry.get("tool_schema")
            name = (schema or {}).get("function", {}).get("name") if isinstance(schema, dict) else None
            if not name or not isinstance(schema, dict):
                raise ToolConfigError(f"{where}.tool_schema.function.name: required")
            jsonschema = jsonschema_module()
            try:
                jsonschema.Draft202012Validator.check_schema(schema["function"].get("parameters", {}))
            except jsonschema.SchemaError as exc:
                raise ToolConfigError(
                    f"{where}.tool_schema.function.parameters: not a valid JSON schema: {exc.message}"
                ) from None
            if not entry.get("callable"):
                raise ToolConfigError(f"{where}.callable: required ('module:function')")
            try:
                function = load_callable(entry["callable"], base_dir)
            except LoadError as exc:
                raise ToolConfigError(f"{where}.callable: {exc}") from None
            tools.append(Tool(name, schema, function))
        return cls(tools, max_output_chars)

    @classmethod
    def from_file(cls, path: str | Path, max_output_chars: int = 2000) -> ToolRegistry:
        path = Path(path)
        try:
            document = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ToolConfigError(f"{path}: tool config not found") from None
        except yaml.YAMLError as exc:
            raise ToolConfigError(f"{path}: not valid YAML/JSON: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("tools"), list):
            raise ToolConfigError(f"{path}: expected a mapping with a `tools:` list")
        return cls.from_config(document["tools"], path.parent, f"{path}: tools", max_output_chars)

    @property
    def schemas(self) -> list[dict]:
        return [tool.schema for tool in self.tools.values()]

    def call(self, name: str, arguments: dict, task: dict | None = None) -> ToolResult:
        started = time.perf_counter()
        tool = self.tools.get(name)
        if tool is None:
            output = f"error: unknown tool {name!r} (available: {', '.join(sorted(self.tools)) or 'none'})"
            return ToolResult(name, arguments, output, False, time.perf_counter() - started)
        jsonschema = jsonschema_module()
        try:
            jsonschema.validate(arguments, tool.parameters)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
            return ToolResult(
                name,
                arguments,
                f"error: invalid arguments for {name} ({where}): {exc.message}",
                False,
                time.perf_counter() - started,
            )
        extra: dict = {}
        try:
            value = tool.function(**arguments, task=task) if tool.wants_task else tool.function(**arguments)
            if isinstance(value, ToolOutput):  # a verl tool: its text, with its reward and metrics kept apart
                extra = {"reward": value.reward, "metrics": value.metrics}
                value = value.text
            output, ok = value if isinstance(value, str) else json.dumps(value, default=str), True
        except Exception as exc:  # the model reads what went wrong; the rollout goes on
            output, ok = f"error: {name} raised {type(exc).__name__}: {exc}", False
        if len(output) > self.max_output_chars:
            output = output[: self.max_output_chars] + "...(truncated)"
        return ToolResult(name, arguments, output, ok, time.perf_counter() - started, extra)
