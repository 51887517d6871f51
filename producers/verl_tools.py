"""verl's tool and interaction shapes on StreamRL's agent loop, written from verl's
documented interfaces:

    a tool       BaseTool(config, tool_schema): async create(instance_id=None, **kwargs),
                 async execute(instance_id, parameters, **kwargs) -> (ToolResponse or
                 text, reward, metrics), async calc_reward(instance_id), async release(instance_id)
    an interaction
                 BaseInteraction(config): async start_interaction(instance_id=None, **kwargs),
                 async generate_response(instance_id, messages, **kwargs) -> (done, reply,
                 score, metrics), async calculate_score(instance_id), async finalize_interaction(instance_id)

and their config files: `tools: [{class_name, config, tool_schema}]` and
`interaction: [{name, class_name, config}]`. As in verl's tool agent loop, a call
creates an instance (with the row's `tools_kwargs[name].create_kwargs`), executes it and
releases it; an interaction is started with the row's `interaction_kwargs` (whose `name`
picks one of several) and finalized when the episode ends. A tool's reward and metrics
go into the episode's trace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.producers.interaction import Interaction, InteractionReply


@dataclass
class ToolResponse:
    """What a verl tool returns as its observation (text only here: no images)."""

    text: str | None = None


class BaseTool:
    def __init__(self, config: dict, tool_schema: dict):
        self.config, self.tool_schema = config, tool_schema
        self.name = tool_schema["function"]["name"]

    def get_openai_tool_schema(self) -> dict:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or uuid.uuid4().hex, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[Any, float, dict]:
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        return None


class BaseInteraction:
    def __init__(self, config: dict):
        self.config, self.name = config, config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        return instance_id or uuid.uuid4().hex

    async def generate_response(self, instance_id: str, messages: list[dict], **kwargs) -> tuple[bool, str, float, dict]:
        raise NotImplementedError

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        return None


def run_coroutine(coroutine):
    """A verl tool's coroutine, from the agent loop's synchronous handlers: in a thread of
    its own when this one already runs an event loop (a ToolAgentLoop episode)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def load_object(dotted: str, where: str, beside: Path | None = None):
    """`module.Name` (verl's `class_name` / `_target_`), imported with the folder of the
    config that names it and that folder's parent on sys.path (`module` beside the file,
    or `package.module` from the folder above); ValueError naming `where` otherwise."""
    for folder in (beside.resolve(), beside.resolve().parent) if beside is not None else ():
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    module_name, _, name = str(dotted).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{where}: {dotted!r} does not load: {exc}") from None


def row_kwargs(task: dict | None, key: str) -> dict:
    """`tools_kwargs` / `interaction_kwargs` of a row: at its top level, or in extra_info (verl's place)."""
    task = task or {}
    found = task.get(key)
    if found is None:
        found = (task.get("extra_info") or {}).get(key)
    return dict(found or {})


def verl_tool_function(tool: BaseTool):
    """The agent loop's tool function for a verl tool: create, execute, release."""

    def call(task=None, **arguments):
        kwargs = row_kwargs(task, "tools_kwargs").get(tool.name, {})

        async def one_call():
            created = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
            instance_id = created[0] if isinstance(created, tuple) else created
            try:
                response, reward, metrics = await tool.execute(instance_id, arguments, **kwargs.get("execute_kwargs", {}))
            finally:
                await tool.release(instance_id, **kwargs.get("release_kwargs", {}))
            text = response.text if isinstance(response, ToolResponse) else str(response)
            return ToolOutput(text or "", float(reward or 0.0), dict(metrics or {}))

        return run_coroutine(one_call())

    return call


@dataclass
class ToolOutput:
    """A verl tool's observation with its step reward and metrics (kept in the trace)."""

    text: str
    reward: float
    metrics: dict

    def __str__(self) -> str:
        return self.text


class VerlInteraction(Interaction):
    """One of verl's interactions (from its config file) as the agent loop's interaction:
    the row's `interaction_kwargs` start it, pick it by `name`, and go with every reply."""

    def __init__(self, interactions: dict[str, BaseInteraction]):
        super().__init__()
        self.interactions, self.instance_id, self.chosen = interactions, "", None

    def start(self, task):
        kwargs = row_kwargs(task, "interaction_kwargs")
        name = kwargs.get("name") or next(iter(self.interactions))
        if name not in self.interactions:
            raise ValueError(f"interaction_kwargs.name {name!r} is not configured (configured: {', '.join(self.interactions)})")
        self.chosen, self.kwargs = self.interactions[name], kwargs
        self.instance_id = run_coroutine(self.chosen.start_interaction(None, **kwargs))

    def respond(self, messages, task):
        assert self.chosen is not None
        done, reply, score, metrics = run_coroutine(self.chosen.generate_response(self.instance_id, messages, **self.kwargs))
        return InteractionReply(done=bool(done), reply=reply, reward=float(score or 0.0), meta=dict(metrics or {}))

    def finish(self, task):
        if self.chosen is not None:
            run_coroutine(self.chosen.finalize_interaction(self.instance_id))


def load_interactions(entries: list, where: str, beside: Path | None = None) -> dict[str, BaseInteraction]:
    """verl's interaction config: `[{name, class_name, config}]`, as {name: instance}."""
    found = {}
    for index, entry in enumerate(entries or []):
        spot = f"{where}[{index}]"
        if not isinstance(entry, dict) or not entry.get("class_name"):
            raise ValueError(f"{spot}: each interaction needs a class_name (module.Class)")
        cls = load_object(entry["class_name"], f"{spot}.class_name", beside)
        config = {**(entry.get("config") or {}), "name": entry.get("name") or (entry.get("config") or {}).get("name")}
        instance = cls({k: v for k, v in config.items() if v is not None})
        found[instance.name] = instance
    if not found:
        raise ValueError(f"{where}: no interaction configured")
    return found
