"""Every name the guide's code imports, from one module: port a recipe's code by
pointing its imports here (`from streamrl.api import BaseRolloutWorker, Trajectory`).

    guide module                         names
    nexrl.rollout_worker                 BaseRolloutWorker, BaseNexAURolloutWorker, Evaluator,
                                         BaseEvaluationTarget, NexAUEvaluationTarget, EvaluationRunResult
    nexrl.nexrl_types                    Trajectory, Batch
    nexrl.trainer                        BaseTrainer, SelfHostedTrainer, SelfHostedGrpoTrainer, RemoteApiTrainer,
                                         RemoteApiGrpoTrainer, RemoteApiCrossEntropyTrainer
    nexrl.algorithm.core_algos           compute_grpo_advantage_for_trajectories
    nexrl.utils.torch_functional         padding_data, compute_position_id_with_mask
    nexrl.utils.logging_utils            log_rollout_metrics, log_grpo_metrics
    nexau.archs.tracer.adapters          InMemoryTracer (the agent loop's episodes)

and what a recipe's own code uses besides: `AgentRolloutWorker` (the agent worker),
`lookup` (a row's value by dotted key), `make_evaluator` and `run_evaluator` (the
built-in graders), `token_loss_mask`, `build_tiny_model` and `is_current` (set-up
scripts that build a small model once).

Each name is imported when first used: `from streamrl.api import lookup` does not import
torch, so a set-up script or an evaluator starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> (module, attribute in it)
_NAMES = {
    "Batch": ("streamrl.learner.batch_trainers", "Batch"),
    "SelfHostedGrpoTrainer": ("streamrl.learner.batch_trainers", "SelfHostedGrpoTrainer"),
    "SelfHostedTrainer": ("streamrl.learner.batch_trainers", "SelfHostedTrainer"),
    "compute_position_id_with_mask": ("streamrl.learner.batch_trainers", "compute_position_id_with_mask"),
    "padding_data": ("streamrl.learner.batch_trainers", "padding_data"),
    "log_grpo_metrics": ("streamrl.learner.step_metrics", "log_grpo_metrics"),
    "log_rollout_metrics": ("streamrl.learner.step_metrics", "log_rollout_metrics"),
    "RemoteApiCrossEntropyTrainer": ("streamrl.learner.remote_trainers", "RemoteApiCrossEntropyTrainer"),
    "RemoteApiGrpoTrainer": ("streamrl.learner.remote_trainers", "RemoteApiGrpoTrainer"),
    "RemoteApiTrainer": ("streamrl.learner.remote_trainers", "RemoteApiTrainer"),
    "Trainer": ("streamrl.learner.trainers", "Trainer"),
    # The guide's base of every trainer, "for a completely custom training loop": StreamRL's
    # Trainer, whose `prepare(items)` and `step(items)` a subclass overrides.
    "BaseTrainer": ("streamrl.learner.trainers", "Trainer"),
    "compute_grpo_advantage_for_trajectories": ("streamrl.learner.trainers", "compute_grpo_advantage_for_trajectories"),
    "InMemoryTracer": ("streamrl.producers.agent_facade", "InMemoryTracer"),
    "AgentRolloutWorker": ("streamrl.producers.agent_worker", "AgentRolloutWorker"),
    "BaseNexAURolloutWorker": ("streamrl.producers.agent_worker", "AgentRolloutWorker"),  # the guide's agent worker base
    "BaseEvaluationTarget": ("streamrl.producers.evaluator", "BaseEvaluationTarget"),
    "EvaluationRunResult": ("streamrl.producers.evaluator", "EvaluationRunResult"),
    "Evaluator": ("streamrl.producers.evaluator", "Evaluator"),
    "NexAUEvaluationTarget": ("streamrl.producers.evaluator", "NexAUEvaluationTarget"),
    "run_evaluator": ("streamrl.producers.evaluator", "run_evaluator"),
    "make_evaluator": ("streamrl.producers.evaluator_builtins", "make_evaluator"),
    "AgentData": ("streamrl.producers.agent_loop", "AgentData"),
    "AgentLoop": ("streamrl.producers.agent_loop", "AgentLoop"),
    "AgentState": ("streamrl.producers.agent_loop", "AgentState"),
    "ToolAgentLoop": ("streamrl.producers.verl_agent_loop", "ToolAgentLoop"),
    "agent_state": ("streamrl.producers.verl_agent_loop", "agent_state"),  # verl's module name in its skeletons
    "BaseTool": ("streamrl.producers.verl_tools", "BaseTool"),
    "BaseInteraction": ("streamrl.producers.verl_tools", "BaseInteraction"),
    "ToolResponse": ("streamrl.producers.verl_tools", "ToolResponse"),
    "BaseRolloutWorker": ("streamrl.producers.rollout", "BaseRolloutWorker"),
    "Trajectory": ("streamrl.producers.rollout", "Trajectory"),
    "token_loss_mask": ("streamrl.producers.rollout", "token_loss_mask"),
    "lookup": ("streamrl.runtime.dataset", "lookup"),
    "is_current": ("streamrl.runtime.builtin_families", "is_current"),
    "generated_is_current": ("streamrl.runtime.builtin_families", "generated_is_current"),
    "build_tiny_model": ("streamrl.runtime.tiny_lm", "build_tiny_model"),
}
__all__ = sorted(_NAMES)

if TYPE_CHECKING:  # what type checkers and go-to-definition follow
    from streamrl.learner.batch_trainers import (
        Batch,
        SelfHostedGrpoTrainer,
        SelfHostedTrainer,
        compute_position_id_with_mask,
        padding_data,
    )
    from streamrl.learner.remote_trainers import RemoteApiCrossEntropyTrainer, RemoteApiGrpoTrainer, RemoteApiTrainer
    from streamrl.learner.step_metrics import log_grpo_metrics, log_rollout_metrics
    from streamrl.learner.trainers import Trainer, compute_grpo_advantage_for_trajectories
    from streamrl.learner.trainers import Trainer as BaseTrainer
    from streamrl.producers.agent_facade import InMemoryTracer
    from streamrl.producers.agent_loop import AgentData, AgentLoop, AgentState
    from streamrl.producers.agent_worker import AgentRolloutWorker
    from streamrl.producers.agent_worker import AgentRolloutWorker as BaseNexAURolloutWorker
    from streamrl.producers.evaluator import (
        BaseEvaluationTarget,
        EvaluationRunResult,
        Evaluator,
        NexAUEvaluationTarget,
        run_evaluator,
    )
    from streamrl.producers.evaluator_builtins import make_evaluator
    from streamrl.producers.rollout import BaseRolloutWorker, Trajectory, token_loss_mask
    from streamrl.producers.verl_agent_loop import ToolAgentLoop, agent_state
    from streamrl.producers.verl_tools import BaseInteraction, BaseTool, ToolResponse
    from streamrl.runtime.builtin_families import generated_is_current, is_current
    from streamrl.runtime.dataset import lookup
    from streamrl.runtime.tiny_lm import build_tiny_model


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'streamrl.api' has no attribute {name!r}")
    module, attribute = _NAMES[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return __all__
