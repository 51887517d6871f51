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

The guide's other agent form (its ComplexTaskWorker) works too:

    tracer = InMemoryTracer()
    final_answer = self.agent.run(query, client=self.client, tracer=tracer)
    trace = tracer.get_trace()                        # {"type": "agent", "children": [...]}
    for child in trace.get("children", []):
        self.child_processor(child, trajectories)     # one info per LLM call
    tokens = self._generate_tokens(trajectories)
    loss_mask = self.get_train_loss_mask(trajectories)    # one value per call
    return self._put_trajectory({"tokens": tokens, "loss_mask": loss_mask, "reward": ..., ...})

Each child of the trace is one LLM call: `type: llm` and the call's trajectory info
(prompt and response tokens and messages, tool calls, `is_final`, `start`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class InMemoryTracer:
    """Keeps the episodes of the runs it traced (`dump_traces()`), and the newest one as a
    span tree (`get_trace()`)."""

    def __init__(self):
        self._traces: list = []
        self._spans: list[dict[str, Any]] = []

    def record(self, episode, calls: list[dict[str, Any]] | None = None) -> None:
        self._traces.append(episode)
        self._spans.append(
            {
                "type": "agent",
                "output": episode.final_answer,
                "termination": episode.termination,
                "children": [{"type": "llm", **call} for call in calls or []],
            }
        )

    def dump_traces(self) -> list:
        return list(self._traces)

    def get_trace(self) -> dict[str, Any]:
        """The newest run as a span: `children` holds one `type: llm` span per LLM call."""
        if not self._spans:
            raise RuntimeError("get_trace(): this tracer has traced no run (pass it to agent.run(..., tracer=))")
        return self._spans[-1]


@dataclass
class AgentSettings:
    tracers: list = field(default_factory=lambda: [InMemoryTracer()])


class LoopAgent:
    """What `load_agent_from_config` returns: one agent config, bound to one task."""

    def __init__(
        self,
        run_episode: Callable[[str, Any], Any],
        default_client,
        describe_calls: Callable[[Any], list[dict[str, Any]]] | None = None,
    ):
        self._run_episode = run_episode
        self._default_client = default_client
        self._describe_calls = describe_calls or (lambda episode: [])
        self.config = AgentSettings()
        self.history: list[dict[str, Any]] = []

    def run(
        self,
        query: str,
        custom_llm_client_provider: Callable[[], Any] | None = None,
        client=None,
        tracer: InMemoryTracer | None = None,
    ) -> str:
        """One episode with `query` as the user message, on `client` (or the provider's,
        or the worker's); the agent's tracers and `tracer` record it."""
        if client is None:
            client = custom_llm_client_provider() if custom_llm_client_provider else self._default_client
        episode = self._run_episode(query, client)
        calls = self._describe_calls(episode)
        for each in [*self.config.tracers, *([tracer] if tracer is not None else [])]:
            each.record(episode, calls)
        self.history = episode.messages
        return episode.final_answer
