"""Building the step's trainer from the recipe, whichever kind its class is: a
self-hosted `Trainer` (keyword parts), the guide's `SelfHostedTrainer` (`cls(config)`),
or a remote trainer (its model lives in the training service)."""

from __future__ import annotations

from learner.batch_trainers import SelfHostedTrainer
from learner.remote_trainers import RemoteApiTrainer
from learner.trainers import Trainer


def build_trainer(cls: type, recipe, model, pad_id: int, ref_model=None, placement=None) -> Trainer:
    """The step's trainer: a guide-style class is built as `cls(config)` with the whole
    recipe as an OmegaConf config (its own `algorithm.*` keys included)."""
    from omegaconf import OmegaConf

    parts = dict(model=model, pad_id=pad_id, trainer_config=recipe.trainer, algorithm_config=recipe.algorithm,
                 temperature=recipe.rollout_worker.temperature, ref_model=ref_model, placement=placement)
    if issubclass(cls, RemoteApiTrainer):  # its model is the service's; it only prepares trajectories
        return cls(OmegaConf.create(recipe.to_dict()))
    if issubclass(cls, SelfHostedTrainer):
        # the guide's signature is cls(config): the parts go on the instance before __init__ runs
        trainer = cls.__new__(cls)
        trainer._runtime_parts = parts
        trainer.__init__(OmegaConf.create(recipe.to_dict()))
        return trainer
    return cls(**parts)
