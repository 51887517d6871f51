"""Checks a recipe needs the whole tree for: its own code loads (evaluator, worker,
trainer, advantage estimator), and every key a registry serves names a registered entry.

The app layer does this because only it imports every component: the registries of
trainers, rollout workers and inference backends live with their components, and a
recipe's own plugins register into them when loaded.
"""

from __future__ import annotations

# Importing the components fills their registries.
import streamrl.algos.advantages
import streamrl.algos.kl
import streamrl.algos.losses
import streamrl.algos.lr_schedule
import streamrl.learner.batch_trainers
import streamrl.learner.remote_trainers
import streamrl.learner.trainers
import streamrl.producers.inference
import streamrl.producers.worker_loop  # noqa: F401
from streamrl.data_checks import data_problems
from streamrl.producers.rollout import ROLLOUT_WORKERS
from streamrl.runtime.config import Recipe
from streamrl.runtime.config_reads import undeclared_keys
from streamrl.runtime.inert_keys import inert_key_problems
from streamrl.runtime.registry import registry_problems
from streamrl.runtime.settings import Settings
from streamrl.runtime.topic_retention import topic_configs

# rollout_worker keys only an agent worker reads
AGENT_ONLY_KEYS = (
    "agent_config_path",
    "agent_workspace",
    "agent_loop_config_path",
    "default_agent_loop",
    "tool_config_path",
    "interaction_config_path",
    "max_assistant_turns",
    "max_user_turns",
)


def recipe_code_problems(recipe: Recipe) -> list[str]:
    """Load the recipe's own code now, then check its registry keys, so a typo fails the
    run before it starts, not in a worker's log minutes later."""
    from streamrl.consumers.processor import load_custom_advantages
    from streamrl.learner.remote_trainers import trainer_class
    from streamrl.producers.agent_worker import AgentRolloutWorker, load_agent_setup, with_verl_configs
    from streamrl.producers.verl_agent_loop import chosen_loop, load_agent_loops
    from streamrl.producers.worker_loop import make_evaluator, worker_class

    worker = recipe.rollout_worker
    custom_worker = bool(worker.custom_rollout_worker_module_path)
    custom_trainer = bool(recipe.trainer.custom_trainer_module_path)

    def agent_setup():
        known = custom_worker or worker.type in ROLLOUT_WORKERS
        agent_keys = [
            k
            for k in ("agent_config_path", "agent_workspace", "agent_loop_config_path", "default_agent_loop")
            if getattr(worker, k)
        ]
        if known and issubclass(worker_class(recipe), AgentRolloutWorker):
            setup = load_agent_setup(worker.worker_config())
            with_verl_configs(worker.worker_config(), setup.tools, setup.interaction_class)
            loops = load_agent_loops(worker.agent_loop_config_path) if worker.agent_loop_config_path else {}
            if worker.default_agent_loop:
                chosen_loop(loops, {}, worker.default_agent_loop)
        elif known and agent_keys:  # read by agent workers only
            key = agent_keys[0]
            raise ValueError(
                f"read by agent workers only (rollout_worker.type agent, or a subclass of AgentRolloutWorker), and "
                f"{worker_class(recipe).__name__} is not one; remove rollout_worker.{key}"
            )

    problems = []
    checks = [
        ("rollout_worker.evaluator_module_path", lambda: make_evaluator(recipe)),
        ("rollout_worker.custom_rollout_worker_module_path", lambda: custom_worker and worker_class(recipe)),
        ("rollout_worker.agent_config_path", agent_setup),
        ("trainer.custom_trainer_module_path", lambda: custom_trainer and trainer_class(recipe)),
        ("algorithm.custom_advantage_module_path", lambda: load_custom_advantages(recipe.algorithm.custom_advantage_module_path)),
    ]
    for key, check in checks:
        try:
            check()
        except (ValueError, KeyError) as exc:  # LoadError is a ValueError
            problems.append(f"{key}: {exc.args[0] if exc.args else exc}")
    # Registry keys last: a custom estimator registers only once its module has loaded.
    registry = registry_problems(recipe.to_dict())
    if not any(p.startswith("algorithm.type:") for p in registry):
        problems += estimator_problems(recipe)
    if custom_worker and not problems:  # a worker class that declares its keys: the others are refused
        worker_cls = worker_class(recipe)
        declared = ", ".join(getattr(worker_cls, "config_keys", ()))
        problems += [
            f"rollout_worker.{key}: not one of {worker_cls.__name__}.config_keys ({declared})"
            for key in undeclared_keys(worker_cls, worker.extra)
        ]
    if custom_trainer and not problems:  # the same for a trainer class's own algorithm keys
        trainer_cls = trainer_class(recipe)
        declared = ", ".join(getattr(trainer_cls, "config_keys", ()))
        problems += [
            f"algorithm.{key}: not one of {trainer_cls.__name__}.config_keys ({declared})"
            for key in undeclared_keys(trainer_cls, recipe.algorithm.extra)
        ]
    try:  # the broker this command would use (an external Kafka, or the embedded one)
        topic_configs(recipe.service.broker, Settings.from_env())
    except ValueError as exc:
        problems.append(str(exc))
    # A key nothing reads in this combination, last: a misspelt registry name says so first.
    inert = [] if registry else inert_key_problems(recipe)
    return problems + data_problems(recipe) + tracker_problems(recipe) + registry + inert


def estimator_problems(recipe: Recipe) -> list[str]:
    """Turn-level credit needs an estimator of the (r - b) / s form, which a batch-scope
    or a recipe's own estimator does not declare."""
    from streamrl.algos.advantages import GROUP_BASELINES
    from streamrl.learner.batch_trainers import SelfHostedTrainer
    from streamrl.learner.remote_trainers import RemoteApiGrpoTrainer, trainer_class

    algorithm, worker = recipe.algorithm, recipe.rollout_worker
    if algorithm.credit_assignment != "turn":
        return []
    if algorithm.type not in GROUP_BASELINES:
        return [
            f"algorithm.credit_assignment: turn needs an estimator with a baseline form "
            f"({', '.join(sorted(GROUP_BASELINES))}); {algorithm.type!r} has none"
        ]
    if worker.type == "single_turn" and not worker.custom_rollout_worker_module_path:
        return [
            "algorithm.credit_assignment: turn acts on multi-turn episodes; the single_turn worker's "
            "rollouts have one assistant turn (use rollout_worker.type agent, or a worker that records turns)"
        ]
    try:
        trainer = trainer_class(recipe)
    except (ValueError, KeyError):
        return []  # reported with the trainer's own key
    if issubclass(trainer, (RemoteApiGrpoTrainer, SelfHostedTrainer)):
        return [
            f"algorithm.credit_assignment: turn is not kept by trainer {trainer.__name__}, which recomputes "
            "one advantage per episode from the rewards (the guide's form); use trainer.type grpo"
        ]
    return []


TRACKER_PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow"}


def tracker_problems(recipe: Recipe) -> list[str]:
    """A tracker whose package is not installed fails the recipe now, not the tracker
    process later."""
    import importlib.util

    return [
        f"logger.backends: {name} needs the {package} package (pip install 'streamrl[trackers]')"
        for name in recipe.logger.trackers()
        for package in [TRACKER_PACKAGES[name]]
        if importlib.util.find_spec(package) is None
    ]
