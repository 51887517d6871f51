"""Keys that nothing reads in the combination a recipe chose are refused with the reason,
not accepted and ignored.

Each rule names a key, when nothing reads it, and why. A key is refused only when the
recipe sets it to something other than its default, so a recipe that leaves it alone
passes whatever the combination. Checked by `recipe validate` and before every run
(`runtime.recipe.consistency_problems`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

from streamrl.runtime.config import Recipe

# the remote trainers' losses when service.train_service.config.loss_fn is not set
REMOTE_DEFAULT_LOSS = {"remote_api_grpo": "importance_sampling", "remote_api_cross_entropy": "cross_entropy"}


def kl_off(recipe: Recipe) -> bool:
    return not (recipe.algorithm.use_kl_loss or recipe.algorithm.use_kl_in_reward)


def embedded_engine(recipe: Recipe) -> bool:
    return recipe.service.inference_service.backend == "embedded"


def remote(recipe: Recipe) -> bool:
    return recipe.trainer.type in REMOTE_DEFAULT_LOSS


def remote_without_clipping(recipe: Recipe) -> bool:
    """A remote trainer's service loss clips only as ppo or cispo."""
    if not remote(recipe):
        return False
    loss_fn = recipe.service.train_service.config.loss_fn or REMOTE_DEFAULT_LOSS[recipe.trainer.type]
    return loss_fn not in ("ppo", "cispo")


def no_shared_prefix(recipe: Recipe) -> bool:
    """learner/shared_prefix.py uses_shared_prefix, from the recipe."""
    cfg = recipe.trainer
    return cfg.nproc_per_node * cfg.nnodes > 1 or cfg.packing == "packed" or cfg.gradient_checkpointing


def sync_mode(recipe: Recipe) -> bool:
    return recipe.weight.sync_mode == "sync"


def always(recipe: Recipe) -> bool:
    return True


def no_warmup_target(recipe: Recipe) -> bool:
    return recipe.trainer.warmup_until_accuracy is None


def no_learner_accuracy(recipe: Recipe) -> bool:
    """The learner measures held-out accuracy itself only for a built-in single-turn
    worker with validation rows (learner/policy.py val_accuracy)."""
    worker = recipe.rollout_worker
    return (
        not recipe.validate.data.data_files
        or worker.type != "single_turn"
        or bool(worker.custom_rollout_worker_module_path)
        or remote(recipe)
    )


@dataclass(frozen=True)
class Inert:
    key: str  # dotted path
    when: Callable[[Recipe], bool]
    why: str


VALIDATION_ROWS = "validation reads its rows in file order (shuffle: false), all of them or validate.data.max_rows"
EMBEDDED = "the embedded engine runs inside the rollout worker: there is no server to wait for or retry"
REMOTE = "the model trains in the training service, which decides it"
KL = "read only with algorithm.use_kl_loss or algorithm.use_kl_in_reward"

RULES = (
    Inert("validate.data.shuffle", always, VALIDATION_ROWS),
    Inert("validate.data.seed", always, VALIDATION_ROWS),
    Inert("validate.data.max_prompt_length", always, "data.max_prompt_length bounds every prompt, validation's too"),
    Inert(
        "data.max_rows", always, "for validate.data; the training rows are bounded by trainer.total_train_steps or total_epochs"
    ),
    Inert("algorithm.kl_estimator", kl_off, KL),
    Inert("algorithm.kl_ctrl", kl_off, KL),
    Inert("service.inference_service.max_retries", embedded_engine, EMBEDDED),
    Inert("service.inference_service.request_timeout_s", embedded_engine, EMBEDDED),
    Inert(
        "algorithm.clip_ratio_low",
        remote_without_clipping,
        "a remote trainer clips only with service.train_service.config.loss_fn ppo or cispo",
    ),
    Inert(
        "algorithm.clip_ratio_high",
        remote_without_clipping,
        "a remote trainer clips only with service.train_service.config.loss_fn ppo or cispo",
    ),
    Inert("algorithm.clip_ratio_c", remote, "the service's losses have no dual clip"),
    Inert("algorithm.policy_loss", remote, "the service's loss is service.train_service.config.loss_fn"),
    Inert("trainer.dtype", remote, REMOTE),
    Inert("trainer.gradient_checkpointing", remote, REMOTE),
    Inert("trainer.shared_prefix", remote, REMOTE),
    Inert(
        "trainer.shared_prefix",
        no_shared_prefix,
        "a shared prefix runs with one learner process (trainer.nproc_per_node 1), padded rows (trainer.packing "
        "not packed) and trainer.gradient_checkpointing false",
    ),
    Inert(
        "trainer.lora",
        remote,
        "the model is in the training service: a remote trainer's LoRA rank is service.tinker_service.lora_rank",
    ),
    Inert("trainer.warmup_check_every", no_warmup_target, "read only with trainer.warmup_until_accuracy"),
    Inert(
        "trainer.warmup_until_accuracy",
        no_learner_accuracy,
        "the learner measures held-out accuracy only with validate.data.data_files and a built-in single_turn "
        "worker, and not with a remote trainer",
    ),
    Inert(
        "weight.staleness_threshold",
        sync_mode,
        "weight.sync_mode sync trains every step on rollouts of the newest version (staleness 0)",
    ),
)


def value_at(recipe, key: str):
    return reduce(getattr, key.split("."), recipe)


def changed(value, default, key: str) -> list[tuple[str, object]]:
    """(key, value) for the key, or for each field of a section, set away from its default."""
    if dataclasses.is_dataclass(value) and dataclasses.is_dataclass(default):
        return [
            pair
            for f in dataclasses.fields(value)
            for pair in changed(getattr(value, f.name), getattr(default, f.name), f"{key}.{f.name}")
        ]
    return [(key, value)] if value != default else []


def inert_key_problems(recipe: Recipe) -> list[str]:
    """A problem for each key set away from its default where nothing reads it."""
    defaults = Recipe()
    return [
        f"{key}: {value!r} does nothing here: {rule.why}"
        for rule in RULES
        if rule.when(recipe)
        for key, value in changed(value_at(recipe, rule.key), value_at(defaults, rule.key), rule.key)
    ]
