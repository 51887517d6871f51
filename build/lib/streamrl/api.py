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
"""

from streamrl.learner.batch_trainers import (  # noqa: F401
    Batch, SelfHostedGrpoTrainer, SelfHostedTrainer, compute_position_id_with_mask, padding_data,
)
from streamrl.learner.step_metrics import log_grpo_metrics, log_rollout_metrics  # noqa: F401
from streamrl.learner.remote_trainers import (  # noqa: F401
    RemoteApiCrossEntropyTrainer, RemoteApiGrpoTrainer, RemoteApiTrainer,
)
from streamrl.learner.trainers import Trainer, compute_grpo_advantage_for_trajectories  # noqa: F401
from streamrl.producers.agent_facade import InMemoryTracer  # noqa: F401
from streamrl.producers.agent_worker import AgentRolloutWorker
from streamrl.producers.evaluator import (  # noqa: F401
    BaseEvaluationTarget, EvaluationRunResult, Evaluator, NexAUEvaluationTarget,
)
from streamrl.producers.rollout import BaseRolloutWorker, Trajectory  # noqa: F401

BaseNexAURolloutWorker = AgentRolloutWorker  # the guide's agent worker base class
# The guide's base of every trainer, "for a completely custom training loop": StreamRL's
# Trainer, whose `prepare(items)` and `step(items)` a subclass overrides.
BaseTrainer = Trainer
