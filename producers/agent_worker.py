"""The agent rollout worker: an agent config (system prompt, tools, llm_config, limits,
interaction) drives the multi-turn agent loop; the loop's trace becomes the trajectory.

Recipe:

    rollout_worker:
      type: agent
      agent_config_path: agent_workspace/agent_config.yaml
      agent_workspace: agent_workspace          # on sys.path: its modules import each other

Agent config (paths relative to the agent config's folder):

    system_prompt: "You answer with the value the lookup tool returns."
    few_shot:                                   # optional example turns, before the question
      - {role: user, content: "..."}
      - {role: assistant, content: "..."}
    query_template: "Q: {prompt}"               # the user message, from the task's row
    tools: tools.yaml                           # a tool config file, or the list inline
    tools_in_system_prompt: true                # the schemas go to the chat template (tools=), listed as
                                                # the model's family lists them; false: the prompt does it
    tool_call_format: auto                      # how calls are parsed: auto (from the chat template),
                                                # hermes, llama3_json, mistral, or file.py:function
    llm_config: {temperature: 1.0, top_p: 1.0, max_tokens: 64}   # per turn; validation is greedy
    limits: {max_assistant_turns: 8, max_user_turns: 0, max_tool_calls_per_turn: 4, max_total_tokens: 1024}
    interaction: {module_path: "interaction.py:MyUser", kwargs: {}}

Override points, as in the guide: `format_task_query(data_item)` (the user message),
`format_query(task)` (all opening messages), `run_agent(task)` (the whole episode),
`get_train_loss_mask(trajectory_infos)` (one info per LLM call; a value per call, per
response token or per token), `evaluate_episode(task, episode)` (conditional evaluation).
The guide's agent-config keys are read too: `max_context_tokens` (= limits.max_total_tokens),
`name` (recorded with every rollout: extra_fields.agent_name), `type`, `system_prompt_type`,
`tool_call_mode`, `tracers`, `llm_config.api_type` (checked: a value naming another way of
working is refused), tools given by `binding:`.
The reward is the evaluator's reward plus the sum of the interaction's per-turn rewards.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from streamrl.producers.agent_facade import LoopAgent
from streamrl.producers.agent_loop import AgentLimits, Episode, episode_turns
from streamrl.producers.evaluator import BaseEvaluationTarget, EvaluationOutcome, run_evaluator
from streamrl.producers.interaction import Interaction
from streamrl.producers.rollout import BaseRolloutWorker, Trajectory, register_rollout_worker, token_loss_mask
from streamrl.producers.tools import ToolConfigError, ToolRegistry
from streamrl.producers.verl_agent_loop import AgentLoopConfigError, chosen_loop, load_agent_loops, make_loop
from streamrl.producers.verl_tools import VerlInteraction, load_interactions
from streamrl.runtime.plugins import load_class
from streamrl.runtime.tool_call_formats import TOOL_CALL_FORMATS, tool_call_parser

AGENT_CONFIG_KEYS = {
    "system_prompt",
    "few_shot",
    "query_template",
    "tools",
    "tools_in_system_prompt",
    "tool_call_format",
    "llm_config",
    "limits",
    "interaction",
    "max_tool_output_chars",
    # the guide's agent-config keys (checked by `guide_key_problems`)
    "type",
    "name",
    "max_context_tokens",
    "system_prompt_type",
    "tool_call_mode",
    "tracers",
}
LLM_CONFIG_KEYS = {"temperature", "top_p", "max_tokens", "api_type"}

# The guide's agent-config keys that name one way of working: the value StreamRL's agent
# loop has, and why another is refused rather than ignored.
GUIDE_AGENT_VALUES = {
    "type": (("agent",), "an agent config describes one agent"),
    "system_prompt_type": (("string",), "the system prompt is one text"),
    "tool_call_mode": (
        ("openai",),
        "tools are described to the model in the OpenAI function format and its calls parsed by tool_call_format "
        "(Hermes/Qwen JSON, Llama 3, Mistral, a recipe's own); NexAU's XML call syntax is not parsed",
    ),
    "llm_config.api_type": (
        ("openai_chat_completion",),
        "the agent samples token ids from a chat-formatted prompt, as a chat completion does",
    ),
}
IN_MEMORY_TRACER = "InMemoryTracer"  # the only tracer: the episode's trace is kept in memory and saved


def guide_key_problems(config: dict) -> list[str]:
    problems = []
    for key, (allowed, why) in GUIDE_AGENT_VALUES.items():
        section, _, name = key.rpartition(".")
        holder = config.get(section) or {} if section else config
        if name in holder and holder[name] not in allowed:
            problems.append(f"{key}: only {' or '.join(allowed)} ({why}), got {holder[name]!r}")
    for i, tracer in enumerate(config.get("tracers") or []):
        spec = tracer.get("import", "") if isinstance(tracer, dict) else str(tracer)
        if not spec.endswith(IN_MEMORY_TRACER):
            problems.append(
                f"tracers[{i}]: only an {IN_MEMORY_TRACER} (the trace is kept in memory and saved "
                f"with the trajectory: rollout_worker.save_trace / trace_path), got {spec!r}"
            )
    if "max_context_tokens" in config and "max_total_tokens" in (config.get("limits") or {}):
        problems.append("max_context_tokens: the same limit as limits.max_total_tokens; give one")
    return problems


class AgentConfigError(ValueError):
    pass


def with_verl_configs(config: dict, tools: ToolRegistry, interaction_class) -> tuple[ToolRegistry, dict]:
    """The recipe's verl tool and interaction configs (rollout_worker.tool_config_path,
    interaction_config_path), beside the agent config's own tools; one interaction only."""
    tool_path, interaction_path = config.get("tool_config_path"), config.get("interaction_config_path")
    if tool_path:
        added = ToolRegistry.from_file(tool_path)
        clash = sorted(set(added.tools) & set(tools.tools))
        if clash:
            raise AgentConfigError(f"rollout_worker.tool_config_path: {', '.join(clash)} also in the agent config's tools")
        tools = ToolRegistry([*tools.tools.values(), *added.tools.values()], tools.max_output_chars)
    if not interaction_path:
        return tools, {}
    if interaction_class is not None:
        raise AgentConfigError("rollout_worker.interaction_config_path: the agent config names an interaction too; give one")
    try:
        document = yaml.safe_load(Path(interaction_path).read_text()) or {}
        entries = document.get("interaction") or []
        return tools, load_interactions(entries, f"{interaction_path}: interaction", Path(interaction_path).parent)
    except (OSError, yaml.YAMLError, ValueError, AttributeError) as exc:
        raise AgentConfigError(f"rollout_worker.interaction_config_path: {exc}") from None


def load_agent_config(path: str | Path) -> dict[str, Any]:
    """The agent config, checked: unknown keys and wrong shapes are named with the file."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise AgentConfigError(f"{path}: agent config not found") from None
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise AgentConfigError(f"{path}: expected a mapping")
    problems = [f"{key}: unknown key" for key in sorted(set(config) - AGENT_CONFIG_KEYS)]
    problems += [f"llm_config.{key}: unknown key" for key in sorted(set(config.get("llm_config") or {}) - LLM_CONFIG_KEYS)]
    limit_keys = {f.name for f in fields(AgentLimits)} - {"max_tokens_per_turn"}
    problems += [
        f"limits.{key}: unknown key (known: {', '.join(sorted(limit_keys))})"
        for key in sorted(set(config.get("limits") or {}) - limit_keys)
    ]
    for i, message in enumerate(config.get("few_shot") or []):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("user", "assistant", "system")
            or not isinstance(message.get("content"), str)
        ):
            problems.append(f"few_shot[{i}]: expected {{role: user|assistant|system, content: text}}")
    call_format = str(config.get("tool_call_format", "auto"))
    if call_format != "auto" and ":" not in call_format and call_format not in TOOL_CALL_FORMATS:
        problems.append(
            f"tool_call_format: {call_format!r} is none of auto, {', '.join(TOOL_CALL_FORMATS.names())}, or file.py:function"
        )
    interaction = config.get("interaction")
    if interaction is not None and (not isinstance(interaction, dict) or not interaction.get("module_path")):
        problems.append("interaction.module_path: required ('file.py:Class')")
    problems += guide_key_problems(config)
    if problems:
        raise AgentConfigError(f"{path}: " + "; ".join(problems))
    config["_dir"] = str(path.resolve().parent)
    return config


def client_template(client) -> str | None:
    """The chat template `client` renders with (its renderer's, else its tokenizer's)."""
    renderer = getattr(client, "chat", None)
    return renderer.template if renderer is not None else getattr(client.tokenizer, "chat_template", None)


def add_workspace_to_path(workspace: str | Path | None) -> None:
    """The agent workspace's modules import each other by their plain names."""
    if workspace and str(Path(workspace).resolve()) not in sys.path:
        sys.path.insert(0, str(Path(workspace).resolve()))


@dataclass
class AgentSetup:
    config: dict[str, Any]
    tools: ToolRegistry
    interaction_class: type[Interaction] | None
    limits: AgentLimits


def load_agent_setup(worker_config: dict) -> AgentSetup:
    """Everything the rollout_worker section's agent settings name, loaded and checked."""
    add_workspace_to_path(worker_config.get("agent_workspace"))
    if not worker_config.get("agent_config_path"):
        raise AgentConfigError("rollout_worker.agent_config_path: required for an agent worker")
    config = load_agent_config(worker_config["agent_config_path"])
    base = Path(config["_dir"])
    tools = config.get("tools") or []
    max_chars = int(config.get("max_tool_output_chars", 2000))
    try:
        registry = (
            ToolRegistry.from_file(base / tools, max_chars)
            if isinstance(tools, str)
            else ToolRegistry.from_config(tools, base, f"{worker_config['agent_config_path']}: tools", max_chars)
        )
    except ToolConfigError as exc:
        raise AgentConfigError(str(exc)) from None
    interaction = config.get("interaction")
    interaction_class = load_class(interaction["module_path"], base, Interaction) if interaction else None
    llm = config.get("llm_config") or {}
    limit_values = dict(config.get("limits") or {})
    if "max_context_tokens" in config:  # the guide's name for the whole episode's token budget
        limit_values["max_total_tokens"] = int(config["max_context_tokens"])
    limits = AgentLimits(
        **{**limit_values, "max_tokens_per_turn": int(llm.get("max_tokens", worker_config.get("max_response_length", 64)))}
    )
    return AgentSetup(config, registry, interaction_class, limits)


@register_rollout_worker("agent")
@register_rollout_worker("nexau")  # the guide's name for it
class AgentRolloutWorker(BaseRolloutWorker):
    """Multi-turn, tool-using rollouts from an agent config."""

    def __init__(self, config: dict, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        # Built without an agent config (the guide's unit tests: `Worker(DictConfig({...}))`):
        # no system prompt, no tools. A recipe without one is refused before any run.
        setup = (
            load_agent_setup(config)
            if (config or {}).get("agent_config_path")
            else AgentSetup(
                {"_dir": str(Path.cwd())},
                ToolRegistry.from_config([], Path.cwd(), "tools", 2000),
                None,
                AgentLimits(max_tokens_per_turn=int((config or {}).get("max_tokens", 64))),
            )
        )
        self.agent_config, self.tools = setup.config, setup.tools
        self.interaction_class, self.limits = setup.interaction_class, setup.limits
        turns = {key: (config or {}).get(key) for key in ("max_assistant_turns", "max_user_turns")}
        if any(value is not None for value in turns.values()):  # the recipe's (verl's) form of the limits
            self.limits = dataclasses.replace(self.limits, **{k: v for k, v in turns.items() if v is not None})
        self.tools, self.verl_interactions = with_verl_configs(config or {}, self.tools, self.interaction_class)
        registry_path = (config or {}).get("agent_loop_config_path")
        self.agent_loops = load_agent_loops(registry_path) if registry_path else {}
        self.default_agent_loop = (config or {}).get("default_agent_loop")
        if self.default_agent_loop and self.default_agent_loop not in self.agent_loops:
            raise AgentLoopConfigError(
                f"rollout_worker.default_agent_loop: {self.default_agent_loop!r} is not registered in "
                f"rollout_worker.agent_loop_config_path (registered: {', '.join(self.agent_loops) or 'none'})"
            )

    # --- override points ------------------------------------------------------------------
    def format_query(self, task: dict[str, Any]) -> list[dict[str, str]]:
        """The opening messages: system prompt, few-shot turns, the question (a task whose
        prompt is chat messages brings its own; the config's system prompt goes first
        unless they hold one). The chat template lists the tools."""
        cfg = self.agent_config
        system = cfg.get("system_prompt") or ""
        few_shot = [dict(m) for m in cfg.get("few_shot") or []]
        prompt = task.get("prompt")
        if isinstance(prompt, list):
            own_system = [dict(m) for m in prompt[:1] if m.get("role") == "system"]
            opening = own_system or ([{"role": "system", "content": system}] if system else [])
            return opening + few_shot + [dict(m) for m in prompt[len(own_system) :]]
        messages = [{"role": "system", "content": system}] if system else []
        return messages + few_shot + [{"role": "user", "content": self.format_task_query(task)}]

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        """The user message: the agent config's `query_template` filled from the task's
        row (override it, as in the guide, for task-specific prompts)."""
        template = self.agent_config.get("query_template") or "{prompt}"
        try:
            return template.format(**data_item)
        except KeyError as exc:
            raise KeyError(f"agent config query_template needs task field {exc}") from None

    def run_agent(self, task: dict[str, Any]) -> Episode:
        return self.run_episode(task, self.format_query(task))

    def run_episode(self, task: dict[str, Any], messages: list[dict[str, str]], client=None) -> Episode:
        llm = self.agent_config.get("llm_config") or {}
        interaction = (
            self.interaction_class(**(self.agent_config["interaction"].get("kwargs") or {})) if self.interaction_class else None
        )
        if self.verl_interactions:
            interaction = VerlInteraction(self.verl_interactions)
        client = client or self._inference_client
        parse = tool_call_parser(
            str(self.agent_config.get("tool_call_format", "auto")), client_template(client), self.agent_config["_dir"]
        )
        loop_class, loop_args = chosen_loop(self.agent_loops, task, self.default_agent_loop)
        loop = make_loop(
            loop_class,
            loop_args,
            client=client,
            tools=self.tools,
            interaction=interaction,
            limits=self.limits,
            parse=parse,
            list_tools=bool(self.agent_config.get("tools_in_system_prompt", True)),
            # validation samples with the validation settings (greedy)
            temperature=None if task.get("is_val") else llm.get("temperature"),
            top_p=None if task.get("is_val") else llm.get("top_p"),
        )
        return loop.run(messages, task)

    # --- the guide's NexAU-style objects (producers/agent_facade.py) ---------------------------
    def load_agent_from_config(self, custom_llm_client_provider=None):
        """(agent, client provider): `agent.run(query)` runs an episode of this worker's
        agent config for the task being rolled out, `query` as its user message."""
        task = self.current_task()

        def run_episode(query: str, client):
            return self.run_episode(task, [*self.format_query(task)[:-1], {"role": "user", "content": query}], client)

        provider = custom_llm_client_provider or (lambda: self._inference_client)
        return LoopAgent(run_episode, self._inference_client, self.trajectory_infos), provider

    @property
    def agent(self) -> LoopAgent:
        """The guide's `self.agent`: this worker's agent config, bound to the task being
        rolled out (`self.agent.run(query, client=self.client, tracer=tracer)`)."""
        return self.__dict__.get("_agent") or self.load_agent_from_config()[0]

    @agent.setter
    def agent(self, value) -> None:
        self.__dict__["_agent"] = value

    @property
    def client(self):
        """The guide's `self.client`: the inference client the agent samples from."""
        return self.__dict__.get("_client") or self._inference_client

    @client.setter
    def client(self, value) -> None:
        self.__dict__["_client"] = value

    def child_processor(self, child: dict[str, Any], trajectories: list[dict[str, Any]]) -> None:
        """The guide's walk over a trace's children: an LLM call's span adds its
        trajectory info to `trajectories`; other spans add nothing. A per-call loss mask
        given to `_put_trajectory` is read against these infos."""
        if child.get("type") == "llm":
            trajectories.append({key: value for key, value in child.items() if key != "type"})
        self._local.call_infos = trajectories

    def _generate_tokens(self, trajectory_infos: list[dict[str, Any]]) -> list[int]:
        """The rollout's tokens from its LLM calls' infos: each call's prompt holds every
        earlier call, so the last call's prompt and response are the whole sequence."""
        if not trajectory_infos:
            return []
        last = trajectory_infos[-1]
        return list(last["prompt_tokens"]) + list(last["response_tokens"])

    def _put_trajectory(self, trajectory) -> str:
        infos = getattr(self._local, "call_infos", None)
        if (
            isinstance(trajectory, dict)
            and infos is not None
            and "tokens" in trajectory
            and len(trajectory.get("loss_mask", ())) != len(trajectory["tokens"])
        ):
            # a mask in the guide's per-call (or per-response-token) form, as get_train_loss_mask gives it
            trajectory = {**trajectory, "loss_mask": token_loss_mask(trajectory["loss_mask"], infos, len(trajectory["tokens"]))}
        return super()._put_trajectory(trajectory)

    def trace_processor(self, traces: list[Episode]) -> list[dict[str, Any]]:
        """The guide's trace processing: each traced episode as a trajectory dict
        (tokens, loss_mask from get_train_loss_mask, logprobs, turns, versions)."""
        trajectories = []
        for episode in traces:
            mask = self.episode_mask(episode)
            trajectories.append(
                {
                    "tokens": episode.tokens,
                    "loss_mask": mask,
                    "logprobs": episode.logprobs,
                    "turns": episode_turns(episode, mask),
                    "token_versions": episode.token_versions,
                    "weight_version": min(episode.weight_versions, default=0),
                    "final_answer": episode.final_answer,
                    "termination": episode.termination,
                    "trace": episode.trace,
                }
            )
        return trajectories

    def evaluate_episode(self, task: dict[str, Any], episode: Episode) -> EvaluationOutcome:
        return run_evaluator(
            self.evaluator, task.get("data", {}), BaseEvaluationTarget(episode.final_answer, observation=episode.messages)
        )

    # --- the rollout ------------------------------------------------------------------------
    def rollout(self, task: dict[str, Any]) -> str | None:
        self._local.call_infos = None
        ran = self.run_agent(task)
        if isinstance(ran, Episode):
            return self._put_trajectory(self.episode_trajectory(task, ran))
        if isinstance(ran, str) or ran is None:  # an override that put its trajectory itself
            return ran
        if isinstance(ran, tuple) and len(ran) == 2:  # the guide's (agent_output, evaluation_result)
            output, evaluation = ran
            trajectories = (getattr(output, "rl_params", None) or {}).get("trajectory") or []
            if len(trajectories) != 1:
                raise ValueError(
                    f"run_agent's agent_output.rl_params['trajectory'] holds {len(trajectories)} "
                    "trajectories; a task is rolled out into one"
                )
            trajectory = {"reward": evaluation.reward, "is_val": task.get("is_val", False), **trajectories[0]}
            trajectory.setdefault("extra_info", evaluation.extra_info)
            trajectory.setdefault("metrics", evaluation.metrics)
            return self._put_trajectory(trajectory)
        raise TypeError(
            f"run_agent returned {type(ran).__name__}: expected the Episode of run_agent_loop, "
            "(agent_output, evaluation_result), or the status _put_trajectory returned"
        )

    def trajectory_infos(self, episode: Episode) -> list[dict[str, Any]]:
        """One info per LLM call (assistant turn), as the guide's trace processing gives
        them: its prompt (tokens and messages), its response (tokens and message, with
        the tool calls it made), whether it is the final turn, and where it starts."""
        infos, start, assistant_messages = [], 0, 0
        calls = [i for i, s in enumerate(episode.segments) if s.role == "assistant"]
        for index, segment in enumerate(episode.segments):
            if segment.role == "assistant":
                message_at = [i for i, m in enumerate(episode.messages) if m["role"] == "assistant"][assistant_messages]
                assistant_messages += 1
                tool_calls = [{"type": "function", "function": {"name": name}} for name in segment.meta.get("tool_calls", [])]
                infos.append(
                    {
                        "role": "assistant",
                        "tokens": segment.tokens,
                        "text": segment.text,
                        "start": start,
                        "prompt_tokens": episode.tokens[:start],
                        "response_tokens": segment.tokens,
                        "prompt_messages": episode.messages[:message_at],
                        "response_message": {"role": "assistant", "content": segment.text, "tool_calls": tool_calls},
                        "tools": self.tools.schemas,
                        "is_final": index == calls[-1],
                        "finish_reason": segment.meta.get("finish_reason"),
                    }
                )
            start += len(segment.tokens)
        return infos

    def episode_mask(self, episode: Episode) -> list[int]:
        """get_train_loss_mask's answer as one 0/1 per token of the episode, checked."""
        infos = self.trajectory_infos(episode)
        mask = token_loss_mask(self.get_train_loss_mask(infos), infos, len(episode.tokens))
        sampled = [s.sampled for s in episode.segments for _ in s.tokens]
        if any(m and not was_sampled for m, was_sampled in zip(mask, sampled)):
            raise ValueError(
                "get_train_loss_mask trains tokens the model did not sample (prompt, tool or user "
                "tokens): they have no behaviour logprob"
            )
        return mask

    def episode_trajectory(self, task: dict[str, Any], episode: Episode) -> Trajectory:
        """The episode (its segments and trace) as one trajectory."""
        tokens = episode.tokens
        mask = self.episode_mask(episode)
        outcome = self.evaluate_episode(task, episode)
        turn_rewards = episode.turn_rewards
        metrics = dict(outcome.result.metrics)
        metrics.update(
            assistant_turns=episode.assistant_turns,
            user_turns=episode.user_turns,
            tool_calls=episode.tool_calls,
            tool_errors=episode.tool_errors,
            evaluator_reward=outcome.result.reward,
            turn_reward_sum=float(sum(turn_rewards)),
        )
        prompt_tokens = len(episode.segments[0].tokens)
        return Trajectory(
            tokens=tokens,
            loss_mask=mask,
            reward=outcome.result.reward + float(sum(turn_rewards)),
            is_val=task.get("is_val", False),
            logprobs=episode.logprobs,
            turns=episode_turns(episode, mask),
            weight_version=min(episode.weight_versions, default=0),
            token_versions=episode.token_versions,
            extra_fields={
                "metrics": metrics,
                "ground_truth": outcome.result.ground_truth,
                "evaluator_error": outcome.error,
                "extra_info": outcome.result.extra_info,
                "final_answer": episode.final_answer,
                "response": self._inference_client.tokenizer.decode(tokens[prompt_tokens:]),
                "termination": episode.termination,
                "trace": episode.trace,
                "finish_reason": episode.termination,
                **({"agent_name": self.agent_config["name"]} if self.agent_config.get("name") else {}),
            },
        )
