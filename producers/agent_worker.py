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
    tools_in_system_prompt: true                # Qwen-style tool listing in the system prompt
    llm_config: {temperature: 1.0, top_p: 1.0, max_tokens: 64}   # per turn; validation is greedy
    limits: {max_assistant_turns: 8, max_user_turns: 0, max_tool_calls_per_turn: 4, max_total_tokens: 1024}
    interaction: {module_path: "interaction.py:MyUser", kwargs: {}}

Override points, as in the guide: `format_query(task)` (prompt templates),
`run_agent(task)` (the whole episode), `get_train_loss_mask(trajectory_infos)`
(token-level loss masks), `evaluate_episode(task, episode)` (conditional evaluation).
The reward is the evaluator's reward plus the sum of the interaction's per-turn rewards.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from producers.agent_loop import AgentLimits, Episode, episode_turns, run_agent_loop
from runtime.chat_format import tools_system_text
from producers.evaluator import BaseEvaluationTarget, EvaluationOutcome, run_evaluator
from producers.interaction import Interaction
from producers.rollout import BaseRolloutWorker, Trajectory, register_rollout_worker
from producers.tools import ToolConfigError, ToolRegistry
from runtime.plugins import load_class

AGENT_CONFIG_KEYS = {"system_prompt", "few_shot", "query_template", "tools", "tools_in_system_prompt",
                     "llm_config", "limits", "interaction", "max_tool_output_chars"}
LLM_CONFIG_KEYS = {"temperature", "top_p", "max_tokens"}


class AgentConfigError(ValueError):
    pass


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
    problems += [f"limits.{key}: unknown key (known: {', '.join(sorted(limit_keys))})"
                 for key in sorted(set(config.get("limits") or {}) - limit_keys)]
    for i, message in enumerate(config.get("few_shot") or []):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system") \
                or not isinstance(message.get("content"), str):
            problems.append(f"few_shot[{i}]: expected {{role: user|assistant|system, content: text}}")
    interaction = config.get("interaction")
    if interaction is not None and (not isinstance(interaction, dict) or not interaction.get("module_path")):
        problems.append("interaction.module_path: required ('file.py:Class')")
    if problems:
        raise AgentConfigError(f"{path}: " + "; ".join(problems))
    config["_dir"] = str(path.resolve().parent)
    return config


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
        registry = ToolRegistry.from_file(base / tools, max_chars) if isinstance(tools, str) else \
            ToolRegistry.from_config(tools, base, f"{worker_config['agent_config_path']}: tools", max_chars)
    except ToolConfigError as exc:
        raise AgentConfigError(str(exc)) from None
    interaction = config.get("interaction")
    interaction_class = load_class(interaction["module_path"], base, Interaction) if interaction else None
    llm = config.get("llm_config") or {}
    limits = AgentLimits(**{**(config.get("limits") or {}),
                            "max_tokens_per_turn": int(llm.get("max_tokens", worker_config.get("max_response_length", 64)))})
    return AgentSetup(config, registry, interaction_class, limits)


@register_rollout_worker("agent")
class AgentRolloutWorker(BaseRolloutWorker):
    """Multi-turn, tool-using rollouts from an agent config."""

    def __init__(self, config: dict, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        setup = load_agent_setup(config)
        self.agent_config, self.tools = setup.config, setup.tools
        self.interaction_class, self.limits = setup.interaction_class, setup.limits

    # --- override points ------------------------------------------------------------------
    def format_query(self, task: dict[str, Any]) -> list[dict[str, str]]:
        """The opening messages: system prompt (with the tool listing), few-shot turns, the question."""
        cfg = self.agent_config
        system = cfg.get("system_prompt") or ""
        if self.tools.tools and cfg.get("tools_in_system_prompt", True):
            system += tools_system_text(self.tools.schemas)
        messages = [{"role": "system", "content": system}] if system else []
        messages += [dict(m) for m in cfg.get("few_shot") or []]
        template = cfg.get("query_template") or "{prompt}"
        try:
            question = template.format(**task)
        except KeyError as exc:
            raise KeyError(f"agent config query_template needs task field {exc}") from None
        return messages + [{"role": "user", "content": question}]

    def run_agent(self, task: dict[str, Any]) -> Episode:
        llm = self.agent_config.get("llm_config") or {}
        interaction = self.interaction_class(**(self.agent_config["interaction"].get("kwargs") or {})) \
            if self.interaction_class else None
        return run_agent_loop(self._inference_client, self.format_query(task), self.tools, interaction,
                              task, self.limits,
                              # validation samples with the validation settings (greedy)
                              temperature=None if task.get("is_val") else llm.get("temperature"),
                              top_p=None if task.get("is_val") else llm.get("top_p"))

    def get_train_loss_mask(self, trajectory_infos: list[dict[str, Any]]) -> list[int]:
        """One entry per token of the whole episode: the model's own turns train; prompt,
        tool results and user turns do not."""
        return [int(info["role"] == "assistant") for info in trajectory_infos for _ in info["tokens"]]

    def evaluate_episode(self, task: dict[str, Any], episode: Episode) -> EvaluationOutcome:
        return run_evaluator(self.evaluator, task.get("data", {}),
                             BaseEvaluationTarget(episode.final_answer, observation=episode.messages))

    # --- the rollout ------------------------------------------------------------------------
    def rollout(self, task: dict[str, Any]) -> str | None:
        episode = self.run_agent(task)
        return self._put_trajectory(self.trace_processor(task, episode))

    def trace_processor(self, task: dict[str, Any], episode: Episode) -> Trajectory:
        """The episode (its segments and trace) as one trajectory."""
        infos = [{"role": s.role, "tokens": s.tokens, "text": s.text, "sampled": s.sampled}
                 for s in episode.segments]
        mask = [int(bool(m)) for m in self.get_train_loss_mask(infos)]
        tokens = episode.tokens
        if len(mask) != len(tokens):
            raise ValueError(f"get_train_loss_mask gave {len(mask)} entries for {len(tokens)} tokens")
        sampled = [s.sampled for s in episode.segments for _ in s.tokens]
        if any(m and not was_sampled for m, was_sampled in zip(mask, sampled)):
            raise ValueError("get_train_loss_mask trains tokens the model did not sample (prompt, tool or user "
                             "tokens): they have no behaviour logprob")
        outcome = self.evaluate_episode(task, episode)
        turn_rewards = episode.turn_rewards
        metrics = dict(outcome.result.metrics)
        metrics.update(assistant_turns=episode.assistant_turns, user_turns=episode.user_turns,
                       tool_calls=episode.tool_calls, tool_errors=episode.tool_errors,
                       evaluator_reward=outcome.result.reward, turn_reward_sum=float(sum(turn_rewards)))
        prompt_tokens = len(episode.segments[0].tokens)
        return Trajectory(
            tokens=tokens, loss_mask=mask, reward=outcome.result.reward + float(sum(turn_rewards)),
            is_val=task.get("is_val", False), logprobs=episode.logprobs, turns=episode_turns(episode, mask),
            weight_version=min(episode.weight_versions, default=0), token_versions=episode.token_versions,
            extra_fields={"metrics": metrics, "ground_truth": outcome.result.ground_truth,
                          "evaluator_error": outcome.error, "final_answer": episode.final_answer,
                          "response": self._inference_client.tokenizer.decode(tokens[prompt_tokens:]),
                          "termination": episode.termination, "trace": episode.trace,
                          "finish_reason": episode.termination})
