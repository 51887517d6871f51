"""verl's agent-loop extension points on StreamRL's agent loop (producers/agent_loop.py):
a `ToolAgentLoop` whose async state handlers have the names and arguments verl's
documentation gives (`_handle_pending_state`, `_handle_generating_state(agent_data,
sampling_params, ignore_termination=False)`, `_handle_processing_tools_state`,
`_handle_interacting_state`), returning `AgentState` values, so that a subclass written
for verl (the multi-turn note's skeleton) runs with its import line changed:

    from streamrl.api import ToolAgentLoop, agent_state

And the registry of named loops verl reads from `agent_loop_config_path` (a YAML list of
`{name, _target_, ...args}`), chosen per row by `agent_name` or by `default_agent_loop`.
Written from verl's documented interfaces.
"""

from __future__ import annotations

import asyncio
import types
from pathlib import Path
from typing import Any

import yaml

from streamrl.producers.agent_loop import AgentData, AgentLoop, AgentState, Episode
from streamrl.producers.verl_tools import load_object

# verl's module of that name (`agent_state.AgentState.TERMINATED` in the note's skeleton)
agent_state = types.SimpleNamespace(AgentState=AgentState)


class ToolAgentLoop(AgentLoop):
    """The agent loop with verl's async handlers: override one, call `super()` in it, and
    return the next `AgentState`. `sampling_params` holds the turn's temperature and top_p;
    `ignore_termination=True` leaves the turn limit (max_assistant_turns) to the override."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampling_params = {"temperature": self.temperature, "top_p": self.top_p}

    def run(self, messages: list[dict[str, Any]], task: dict[str, Any] | None = None) -> Episode:
        return asyncio.run(self.run_async(messages, task))

    async def run_async(self, messages: list[dict[str, Any]], task: dict[str, Any] | None = None) -> Episode:
        data, state = AgentData(messages=messages, task=task or {}), AgentState.PENDING
        handlers = {
            AgentState.PENDING: lambda: self._handle_pending_state(data, self.sampling_params),
            AgentState.GENERATING: lambda: self._handle_generating_state(data, self.sampling_params),
            AgentState.PROCESSING_TOOLS: lambda: self._handle_processing_tools_state(data),
            AgentState.INTERACTING: lambda: self._handle_interacting_state(data),
        }
        try:
            while state is not AgentState.TERMINATED:
                state = await handlers[state]()
        finally:
            if self.interaction is not None and data.segments:  # it was started
                self.interaction.finish(data.task)
        return data.episode()

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict) -> AgentState:
        return self.handle_pending(agent_data)

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict, ignore_termination: bool = False
    ) -> AgentState:
        return self.handle_generating(agent_data, check_turns=not ignore_termination)

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        return self.handle_processing_tools(agent_data)

    async def _handle_interacting_state(self, agent_data: AgentData) -> AgentState:
        return self.handle_interacting(agent_data)


class AgentLoopConfigError(ValueError):
    pass


def load_agent_loops(path: str | Path) -> dict[str, tuple[type[AgentLoop], dict[str, Any]]]:
    """verl's agent-loop registry file: `- name: NAME, _target_: module.Class, ...args`, as
    {name: (class, args)}; the class must be an AgentLoop (ToolAgentLoop included).
    `module` is imported with the file's folder and its parent on sys.path (verl's
    `_target_: extensions.custom_rollouts.X` beside `extensions/custom_rollouts.yaml`)."""
    path = Path(path)
    try:
        entries = yaml.safe_load(path.read_text()) or []
    except (OSError, yaml.YAMLError) as exc:
        raise AgentLoopConfigError(f"{path}: {exc}") from None
    if not isinstance(entries, list):
        raise AgentLoopConfigError(f"{path}: expected a list of {{name, _target_}} entries")
    loops = {}
    for index, entry in enumerate(entries):
        where = f"{path} [{index}]"
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise AgentLoopConfigError(f"{where}: each entry needs a name and a _target_ (module.Class)")
        try:
            cls = load_object(entry["_target_"], f"{where}: _target_", path.parent)
        except ValueError as exc:
            raise AgentLoopConfigError(str(exc)) from None
        if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
            raise AgentLoopConfigError(f"{where}: {entry['_target_']} is not an AgentLoop (e.g. a ToolAgentLoop subclass)")
        loops[str(entry["name"])] = (cls, {k: v for k, v in entry.items() if k not in ("name", "_target_")})
    return loops


def make_loop(cls: type[AgentLoop], args: dict[str, Any], **loop_kwargs) -> AgentLoop:
    """An instance of a registered loop: the registry entry's own args become attributes
    (`self.max_steps`), as a Hydra-instantiated verl loop receives them."""
    loop = cls(**loop_kwargs)
    for key, value in args.items():
        setattr(loop, key, value)
    return loop


def chosen_loop(loops: dict, row: dict[str, Any], default: str | None) -> tuple[type[AgentLoop], dict[str, Any]]:
    """The row's `agent_name`, else `default_agent_loop`, else StreamRL's own loop."""
    name = row.get("agent_name") or default
    if name is None:
        return AgentLoop, {}
    if name not in loops:
        raise AgentLoopConfigError(f"agent loop {name!r} is not registered (registered: {', '.join(loops) or 'none'})")
    return loops[name]
