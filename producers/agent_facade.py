"""The guide's NexAU-style agent objects, over StreamRL's agent loop, so a worker that
overrides `run_agent` as the guide's type-2 example does runs unchanged:

    agent, provider = self.load_agent_from_config(custom_llm_client_provider=lambda: self._inference_client)
    response = agent.run(query, custom_llm_client_provider=provider)
    traces = next(t for t in agent.config.tracers if isinstance(t, InMemoryTracer)).dump_traces()
    trajectories = self.trace_processor(traces)          # dicts: tokens, loss_mask, logprobs, ...
    ... evaluate, set traj["reward"] ...
    return agent_output, evaluation_result               # agent_output.rl_params["trajectory"]

`agent.run(query)` runs one episode of the worker's agent config (system prompt, tools,
limits, interaction) with `query` as the user message, on the worker's inference client
(a `custom_llm_client_provider` that returns another client is used instead); each
tracer records the episode; `agent.history` is the chat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


class InMemoryTracer:
    """Keeps the episodes of the runs it traced (`dump_traces()`)."""

    def __init__(self):
        self._traces: list = []

    def record(self, episode) -> None:
        self._traces.append(episode)

    def dump_traces(self) -> list:
        return list(self._traces)


@dataclass
class AgentSettings:
    tracers: list = field(default_factory=lambda: [InMemoryTracer()])


class LoopAgent:
    """What `load_agent_from_config` returns: one agent config, bound to one task."""

    def __init__(self, run_episode: Callable[[str, Any], Any], default_client):
        self._run_episode = run_episode
        self._default_client = default_client
        self.config = AgentSettings()
        self.history: list[dict[str, Any]] = []

    def run(self, query: str, custom_llm_client_provider: Callable[[], Any] | None = None) -> str:
        client = custom_llm_client_provider() if custom_llm_client_provider else self._default_client
        episode = self._run_episode(query, client)
        for tracer in self.config.tracers:
            tracer.record(episode)
        self.history = episode.messages
        return episode.final_answer
