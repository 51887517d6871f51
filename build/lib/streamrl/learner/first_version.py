"""Version 0 announced before the learner's start-up, where it is the model folder.

Nothing is sampled until weight version 0 is announced: the publisher paces tasks by
it and the workers load it. The learner announces it once it has imported torch and
transformers, built the model and written the version's folder: on a small machine,
with every process of the run starting at once, that was 14 s of a run's start, all
of it on the path to the first rollout (docs/decisions.md, "Version 0 is the model").

Where version 0 is the model folder exactly (no warm-up, not a replay, full or merged
weights, a local folder of safetensors) and the run has never trained, the learner's
command announces that folder as version 0 before importing any of it (this module
imports neither torch nor transformers). The learner then starts as before and does
not announce version 0 again.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from streamrl.runtime.bus import EventPublisher
from streamrl.runtime.config import Recipe
from streamrl.runtime.db import connect
from streamrl.runtime.folders import LATEST_SNAPSHOT, directory_sha256, run_dir
from streamrl.runtime.settings import Settings
from streamrl.schema.events import WeightVersion


def model_is_version_zero(recipe: Recipe) -> bool:
    """Whether the learner's version 0 holds exactly the model folder's weights."""
    cfg = recipe.trainer
    model = Path(recipe.rollout_worker.model_folder())
    return (
        cfg.warmup_cross_entropy_steps == 0
        and not recipe.replay
        and not cfg.type.startswith("remote_api")
        and (cfg.lora is None or cfg.lora.versions == "merged")
        and int(os.environ.get("WORLD_SIZE", "1")) == 1
        and cfg.nproc_per_node * cfg.nnodes == 1
        and model.is_dir()
        and any(model.glob("*.safetensors"))
    )


def never_trained(settings: Settings, run_id: str, recipe: Recipe) -> bool:
    """No snapshot, and no weight version or step in the ledger: a first start. A ledger
    that does not answer says no: the learner's own start waits for it (runtime/outage.py)."""
    checkpoints = run_dir(settings.home, run_id, recipe.trainer.checkpoint_path)
    if (checkpoints / LATEST_SNAPSHOT).exists():
        return False
    try:
        with connect(settings.database_url, autocommit=True) as conn:
            found = conn.execute(
                "select exists (select 1 from weight_versions where run_id = %s) or exists "
                "(select 1 from train_steps where run_id = %s)",
                (run_id, run_id),
            ).fetchone()
            return not (found and found[0])
    except psycopg.OperationalError:
        return False


def announce_model_as_version_zero(settings: Settings, run_id: str, recipe: Recipe) -> bool:
    """Announce the model folder as version 0 where it is, on a first start; whether it did."""
    if not model_is_version_zero(recipe) or not never_trained(settings, run_id, recipe):
        return False
    model = Path(recipe.rollout_worker.model_folder()).resolve()
    with EventPublisher(settings, stage="learner") as publisher:
        publisher.publish(WeightVersion(run_id=run_id, version=0, step=0, uri=str(model), sha256=directory_sha256(model)))
        publisher.flush()
    return True
