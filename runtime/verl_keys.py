"""verl's key names (from its `ppo_trainer.yaml`) accepted in recipes and overrides:
`apply_verl_keys(values)` moves each to StreamRL's key (converting its value where the
two spell it differently) before the recipe is checked, so the run records StreamRL's
keys, as it does for the guide's spellings (`runtime/guide_forms.py`). A verl key
StreamRL cannot honour is refused naming why; a verl key StreamRL does not know at all
(under actor_rollout_ref, critic, reward_model, custom_reward_function) is refused as
such, never ignored. docs/recipe.md and the README's table are generated from VERL_KEYS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamrl.runtime.guide_forms import _get, _merge, _pop


class Unsupported(ValueError):
    """A verl value StreamRL cannot honour; its message says why."""


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class VerlKey:
    streamrl: tuple[str, ...]  # the key(s) the value goes to
    convert: Callable[[Any], Any] = _same

    def __call__(self, value: Any) -> Any:
        return self.convert(value)

    def note(self) -> str:
        """How the value is converted or which values are accepted (docs/recipe.md)."""
        return getattr(self.convert, "note", "")


def _noted(note: str, convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    convert.note = note  # type: ignore[attr-defined]
    return convert


def _files(value: Any) -> list:
    return [value] if isinstance(value, str) else value


def _named(names: dict[str, str], what: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value not in names:
            raise Unsupported(f"{what} {value!r} has no StreamRL equivalent (known: {', '.join(names)})")
        return names[value]

    return _noted(", ".join(f"{a} → {b}" if a != b else a for a, b in names.items()), convert)


def _only(allowed: tuple, why: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value not in allowed:
            raise Unsupported(why)
        return value

    return _noted(f"only {' or '.join(map(repr, allowed))}: {why}", convert)


def _agent(enable: Any) -> str:
    if enable is not True:
        raise Unsupported("multi_turn.enable: false is a single-turn worker: leave the key out")
    return "agent"


def _packing(remove_padding: Any) -> str:
    return "auto" if remove_padding else "padded"


def _trackers(value: Any) -> list:
    names = _files(value)
    unknown = [n for n in names if n not in ("console", "wandb", "tensorboard", "mlflow")]
    if unknown:
        raise Unsupported(f"trackers {unknown} are not supported (console, wandb, tensorboard, mlflow)")
    return [n for n in names if n != "console"]  # the console always prints


_noted("console is always on; wandb, tensorboard, mlflow", _trackers)
_noted("true → auto, false → padded", _packing)
_noted("a file or a list", _files)


def _positive_freq(key: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, int) and value < 1:
            raise Unsupported(f"verl's {value} (never) has no StreamRL form: {key} is at least 1")
        return value

    return _noted("at least 1", convert)


ADVANTAGE_ESTIMATORS = {
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline",
}
KL_TYPES = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3", "k3+": "k3+"}
POLICY_LOSSES = {"vanilla": "none", "gspo": "gspo"}
ROLLOUT_NAMES = {"sglang": "sglang", "hf": "embedded"}
LR_SCHEDULES = {"constant": "constant", "cosine": "cosine"}
MICRO_BATCHES = "StreamRL sizes micro-batches in tokens: trainer.micro_batch_tokens (verl's ppo_max_token_len_per_gpu)"
ACTOR = "actor_rollout_ref.actor."
LORA = "actor_rollout_ref.model."
ROLLOUT = "actor_rollout_ref.rollout."

VERL_KEYS: dict[str, VerlKey] = {
    "data.train_files": VerlKey(("data.data_files",), _files),
    "data.val_files": VerlKey(("validate.data.data_files",), _files),
    "data.train_batch_size": VerlKey(("trajectory_pool.batch_size",)),
    "data.apply_chat_template_kwargs": VerlKey(("data.chat_template_kwargs",)),
    "data.reward_fn_key": VerlKey(("rollout_worker.evaluator_kwargs.data_source_key",)),
    "algorithm.adv_estimator": VerlKey(("algorithm.type",), _named(ADVANTAGE_ESTIMATORS, "adv_estimator")),
    "actor_rollout_ref.model.path": VerlKey(("rollout_worker.model_path",)),
    "actor_rollout_ref.model.enable_gradient_checkpointing": VerlKey(("trainer.gradient_checkpointing",)),
    # moved together by _lora: rank 0 (verl's default) is no adapter, whatever alpha says
    LORA + "lora_rank": VerlKey(("trainer.lora.rank",), _noted("0: no adapter", _same)),
    LORA + "lora_alpha": VerlKey(("trainer.lora.alpha",)),
    LORA + "target_modules": VerlKey(("trainer.lora.target_modules",)),
    ACTOR + "optim.lr": VerlKey(("trainer.lr",)),
    ACTOR + "optim.weight_decay": VerlKey(("trainer.weight_decay",)),
    ACTOR + "optim.lr_warmup_steps": VerlKey(("trainer.lr_warmup_steps",)),
    ACTOR + "optim.min_lr_ratio": VerlKey(("trainer.min_lr_ratio",)),
    ACTOR + "optim.warmup_style": VerlKey(("trainer.lr_schedule",), _named(LR_SCHEDULES, "warmup_style")),
    ACTOR + "optim.lr_scheduler_type": VerlKey(("trainer.lr_schedule",), _named(LR_SCHEDULES, "lr_scheduler_type")),
    ACTOR + "grad_clip": VerlKey(("trainer.grad_clip",)),
    ACTOR + "clip_ratio": VerlKey(("algorithm.clip_ratio_low", "algorithm.clip_ratio_high")),
    ACTOR + "clip_ratio_low": VerlKey(("algorithm.clip_ratio_low",)),
    ACTOR + "clip_ratio_high": VerlKey(("algorithm.clip_ratio_high",)),
    ACTOR + "clip_ratio_c": VerlKey(("algorithm.clip_ratio_c",)),
    ACTOR + "loss_agg_mode": VerlKey(("algorithm.loss_agg_mode",)),
    ACTOR + "policy_loss.loss_mode": VerlKey(("algorithm.policy_loss",), _named(POLICY_LOSSES, "loss_mode")),
    ACTOR + "use_kl_loss": VerlKey(("algorithm.use_kl_loss",)),
    ACTOR + "kl_loss_coef": VerlKey(("algorithm.kl_ctrl.kl_coef",)),
    ACTOR + "kl_loss_type": VerlKey(("algorithm.kl_estimator",), _named(KL_TYPES, "kl_loss_type")),
    ACTOR + "ppo_max_token_len_per_gpu": VerlKey(("trainer.micro_batch_tokens",)),
    ACTOR + "ppo_epochs": VerlKey((), _only((1,), "StreamRL takes one optimizer step per training step")),
    ACTOR + "ppo_mini_batch_size": VerlKey(
        (),
        _only(
            (None,),
            "StreamRL takes one optimizer step over the whole step's batch (verl's ppo_mini_batch_size equal to "
            "train_batch_size); leave it out",
        ),
    ),
    ACTOR + "ppo_micro_batch_size_per_gpu": VerlKey((), _only((None,), MICRO_BATCHES)),
    ACTOR + "use_dynamic_bsz": VerlKey((), _only((True,), MICRO_BATCHES)),
    "actor_rollout_ref.model.use_remove_padding": VerlKey(("trainer.packing",), _packing),
    ACTOR + "entropy_coeff": VerlKey((), _only((0, 0.0), "StreamRL has no entropy bonus; only 0 is accepted")),
    "actor_rollout_ref.ref.fsdp_config.param_offload": VerlKey(("trainer.ref_model_offload",)),
    ROLLOUT + "name": VerlKey(
        ("service.inference_service.backend",), _named(ROLLOUT_NAMES, "rollout.name (vLLM is not an inference backend here)")
    ),
    ROLLOUT + "n": VerlKey(("rollout_worker.rollout_repeat_n",)),
    ROLLOUT + "temperature": VerlKey(("rollout_worker.temperature",)),
    ROLLOUT + "top_p": VerlKey(("rollout_worker.top_p",)),
    ROLLOUT + "prompt_length": VerlKey(("rollout_worker.max_prompt_length",)),
    ROLLOUT + "response_length": VerlKey(("rollout_worker.max_response_length",)),
    ROLLOUT + "gpu_memory_utilization": VerlKey(("service.inference_service.server_args.mem-fraction-static",)),
    ROLLOUT + "tensor_model_parallel_size": VerlKey(("service.inference_service.server_args.tp-size",)),
    ROLLOUT + "multi_turn.enable": VerlKey(("rollout_worker.type",), _noted("true → agent", _agent)),
    ROLLOUT + "multi_turn.max_assistant_turns": VerlKey(("rollout_worker.max_assistant_turns",)),
    ROLLOUT + "multi_turn.max_user_turns": VerlKey(("rollout_worker.max_user_turns",)),
    ROLLOUT + "multi_turn.use_inference_chat_template": VerlKey(
        (), _only((False,), "the model's turns are always the ids it sampled, thinking included (false is what StreamRL does)")
    ),
    ROLLOUT + "multi_turn.tokenization_sanity_check_mode": VerlKey(
        (),
        _only(
            ("disable", "strict", "ignore_strippable"),
            "the model's turns are never re-tokenised, so there is nothing to check (any of verl's modes)",
        ),
    ),
    ROLLOUT + "multi_turn.tool_config_path": VerlKey(("rollout_worker.tool_config_path",)),
    ROLLOUT + "multi_turn.interaction_config_path": VerlKey(("rollout_worker.interaction_config_path",)),
    ROLLOUT + "agent.agent_loop_config_path": VerlKey(("rollout_worker.agent_loop_config_path",)),
    ROLLOUT + "agent.default_agent_loop": VerlKey(("rollout_worker.default_agent_loop",)),
    ROLLOUT + "val_kwargs.temperature": VerlKey(("validate.temperature",)),
    "trainer.total_training_steps": VerlKey(("trainer.total_train_steps",)),
    "trainer.test_freq": VerlKey(("validate.eval.compute_interval",), _positive_freq("validate.eval.compute_interval")),
    "trainer.val_before_train": VerlKey(("validate.validate_before_train",)),
    "trainer.n_gpus_per_node": VerlKey(("trainer.nproc_per_node",)),
    "trainer.default_local_dir": VerlKey(("trainer.checkpoint_path",)),
    "trainer.project_name": VerlKey(("project_name",)),
    "trainer.experiment_name": VerlKey(("experiment_name",)),
    "trainer.critic_warmup": VerlKey((), _only((0,), "GRPO has no critic: only 0 is accepted")),
    "data.truncation": VerlKey(
        (), _only(("error",), "StreamRL never truncates a prompt: recipe validate names every over-long one")
    ),
    "reward_model.enable": VerlKey((), _only((False,), "StreamRL has no reward-model worker: use an evaluator")),
    "trainer.logger": VerlKey(("logger.backends",), _trackers),
    "algorithm.gamma": VerlKey((), _only((1, 1.0), "GAE's discount: GRPO-family estimators score whole responses")),
    "algorithm.lam": VerlKey((), _only((1, 1.0), "GAE's lambda: GRPO-family estimators have no critic")),
    "data.val_batch_size": VerlKey((), _only((None,), "every validation scores all held-out rows (validate.data.max_rows)")),
}

# verl keys that share StreamRL's name and meaning (nothing to move): listed in the docs
SAME_NAME = (
    "data.max_prompt_length",
    "data.filter_overlong_prompts",
    "data.prompt_key",
    "data.shuffle",
    "data.seed",
    "algorithm.use_kl_in_reward",
    "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.kl_coef",
    "trainer.total_epochs",
    "trainer.save_freq",
    "trainer.nnodes",
    "trainer.device",
)
VERL_ONLY_SECTIONS = ("actor_rollout_ref", "critic", "reward_model", "custom_reward_function")
WHY_UNMAPPED = {
    "critic": "GRPO-family estimators have no critic",
    "custom_reward_function": "StreamRL's reward is an evaluator class: rollout_worker.evaluator_module_path: file.py:Class",
}


def _leaves(values: Any, prefix: str) -> list[str]:
    if not isinstance(values, dict):
        return [prefix]
    return [leaf for key, item in values.items() for leaf in _leaves(item, f"{prefix}.{key}")]


def apply_verl_keys(values: dict) -> list[str]:
    """Move every verl key of `values` to StreamRL's, in place; the problems found."""
    problems = _lora(values)
    for verl_key, spec in VERL_KEYS.items():
        found, value = _get(values, verl_key)
        if not found:
            continue
        _pop(values, verl_key)
        try:
            converted = spec(value)
        except Unsupported as exc:
            problems.append(f"{verl_key}: verl's key, not supported with {value!r}: {exc}")
            continue
        for target in spec.streamrl:
            _merge(values, target, converted, verl_key, problems)
    problems += _norm_adv_by_std(values)
    for section in VERL_ONLY_SECTIONS:
        remaining = values.pop(section, None)
        for leaf in _leaves(remaining, section) if remaining is not None else []:
            why = WHY_UNMAPPED.get(section, "docs/recipe.md lists the verl keys StreamRL accepts")
            problems.append(f"{leaf}: a verl key StreamRL has no equivalent of ({why})")
    return problems


def _norm_adv_by_std(values: dict) -> list[str]:
    """verl's `algorithm.norm_adv_by_std_in_grpo: false` is GRPO without the division by
    the group's standard deviation: StreamRL's `dr_grpo` estimator."""
    found, value = _get(values, "algorithm.norm_adv_by_std_in_grpo")
    if not found:
        return []
    _pop(values, "algorithm.norm_adv_by_std_in_grpo")
    estimator = (values.get("algorithm") or {}).get("type", "grpo")
    if value is True or estimator != "grpo":
        return [] if value is True else [f"algorithm.norm_adv_by_std_in_grpo: false applies to grpo, not {estimator!r}"]
    if value is False:
        values.setdefault("algorithm", {})["type"] = "dr_grpo"
        return []
    return [f"algorithm.norm_adv_by_std_in_grpo: expected true or false, got {value!r}"]


def _lora(values: dict) -> list[str]:
    found = {}
    for name in ("lora_rank", "lora_alpha", "target_modules"):
        present, value = _get(values, LORA + name)
        if present:
            _pop(values, LORA + name)
            found[name] = value
    if not found.get("lora_rank"):
        return []
    problems: list[str] = []
    for name, value in found.items():
        _merge(values, VERL_KEYS[LORA + name].streamrl[0], value, LORA + name, problems)
    return problems
