"""Which policy a learner drives: the model on this machine's devices (learner/policy.py),
in a Tinker-compatible training service (learner/remote_policy.py), or, under the cluster
twin (bench/cluster_twin.py), a model of the time it would take (learner/modelled_policy.py).
They offer the learner loop the same operations."""

from __future__ import annotations

import logging
from pathlib import Path

from streamrl.learner.modelled_policy import ModelledPolicy
from streamrl.learner.policy import Policy
from streamrl.learner.remote_policy import RemotePolicy
from streamrl.learner.remote_trainers import RemoteApiTrainer
from streamrl.learner.trainers import Trainer
from streamrl.runtime.config import Recipe
from streamrl.runtime.gpu_model import twin_from_env

log = logging.getLogger("streamrl.learner")


AnyPolicy = Policy | RemotePolicy | ModelledPolicy


def make_policy(
    recipe: Recipe, trainer_class: type[Trainer] | type[RemoteApiTrainer], checkpoints: Path, run_id: str, logs: Path
) -> AnyPolicy:
    twin = twin_from_env()
    if twin is not None:
        log.warning("cluster twin: the learner's GPUs are modelled (%s), no model is trained", twin.to_env())
        return ModelledPolicy(twin, checkpoints, logs)
    if issubclass(trainer_class, RemoteApiTrainer):
        return RemotePolicy(recipe, trainer_class, checkpoints, run_id)
    return Policy(recipe, trainer_class, checkpoints)
