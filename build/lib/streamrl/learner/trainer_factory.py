"""Building the step's trainer from the recipe, whichever kind its class is: a
self-hosted `Trainer` (keyword parts), the guide's `SelfHostedTrainer` (`cls(config)`),
or a remote trainer (its model lives in the training service)."""

from __future__ import annotations

from typing import Any

from streamrl.learner.batch_trainers import SelfHostedTrainer
from streamrl.learner.remote_trainers import RemoteApiTrainer
from streamrl.learner.trainers import Trainer
from streamrl.runtime.config_reads import trainer_config, unread_keys


def build_trainer(cls: type[Any], recipe, model, pad_id: int, ref_model=None, placement=None) -> Trainer:
    """The step's trainer: a guide-style class is built as `cls(config)` with the whole
    recipe (its own `algorithm.*` keys included) as a mapping that records the keys read
    (runtime/config_reads.py)."""
    parts = dict(
        model=model,
        pad_id=pad_id,
        trainer_config=recipe.trainer,
        algorithm_config=recipe.algorithm,
        temperature=recipe.rollout_worker.temperature,
        ref_model=ref_model,
        placement=placement,
    )
    if issubclass(cls, RemoteApiTrainer):  # its model is the service's; it only prepares trajectories
        return build_guide_trainer(cls, recipe)
    if issubclass(cls, SelfHostedTrainer):
        # the guide's signature is cls(config): the parts go on the instance before __init__ runs
        return build_guide_trainer(cls, recipe, _runtime_parts=parts)
    return cls(**parts)


def build_guide_trainer(cls: type[Any], recipe, **before_init):
    config = trainer_config(recipe.to_dict())
    trainer = object.__new__(cls)  # the instance without __init__: its parts go on first
    trainer.__dict__.update(before_init, _recipe_config=config)
    trainer.__init__(config)
    return trainer


def unread_trainer_keys(trainer, recipe) -> list[str]:
    """The trainer's own `algorithm` keys (none for a built-in trainer) that it never read."""
    config = getattr(trainer, "_recipe_config", None)
    return unread_keys(config["algorithm"], recipe.algorithm.extra) if config is not None else []
