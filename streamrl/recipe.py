"""Recipes: YAML files with `defaults:` composition and `${oc.env:VAR,default}`
interpolation (OmegaConf), checked against a typed schema whose keys follow the NexRL
user guide (project_name, experiment_name, data, rollout_worker, trajectory_pool,
trainer, algorithm, weight, validate, service, logger).

`load_recipe(path)` returns the fully resolved config as plain dicts and lists, or raises
`RecipeError` listing every problem with its key path: unknown keys (with the closest
known one), wrong types, missing files.

Composition: `defaults: [common/base, _self_]` merges `common/base.yaml` (looked up
next to the recipe, then in its parent folders) and then the recipe itself; where
`_self_` stands decides which side wins, as in Hydra.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from learner.lr_schedule import LR_SCHEDULES


class RecipeError(ValueError):
    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = path, problems
        super().__init__(f"{path}: " + ("\n  " if len(problems) > 1 else "") + "\n  ".join(problems))


def path_field(default=None, **kwargs):
    """A field naming a file or folder that must exist (relative to the recipe's folder)."""
    return field(default=default, metadata={"path": True}, **kwargs)


@dataclass
class Environment:
    setup_script: Optional[str] = path_field()
    env_script: Optional[str] = path_field()  # a shell file sourced before ${oc.env:...} resolve


@dataclass
class Data:
    type: str = "jsonl"  # jsonl | parquet
    data_files: list[str] = field(default_factory=list, metadata={"path": True})
    shuffle: bool = True
    seed: int = 42
    max_prompt_length: int = 512
    prompt_key: str = "prompt"
    answer_key: str = "answer"  # the target text, for the cross-entropy trainer and warm-up
    batch_size: int = 1
    num_workers: int = 1
    max_rows: Optional[int] = None  # validation: use only the first N rows


@dataclass
class RolloutWorker:
    type: str = "single_turn"
    custom_rollout_worker_module_path: Optional[str] = path_field()
    custom_rollout_worker_class_name: Optional[str] = None
    evaluator_module_path: Optional[str] = None  # "file.py:ClassName" or "builtin:NAME"
    evaluator_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the evaluator's constructor
    agent_config_path: Optional[str] = path_field()  # type: agent (producers/agent_worker.py)
    agent_workspace: Optional[str] = path_field()  # a folder put on sys.path: its modules import each other
    tokenizer: Optional[str] = None
    model_path: Optional[str] = None
    task_name: str = ""
    max_prompt_length: int = 512
    max_response_length: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    rollout_repeat_n: int = 8
    num_workers: int = 1
    max_concurrent_tasks: int = 16
    max_retries: int = 2


@dataclass
class TrajectoryPool:
    type: str = "default"
    batch_size: int = 8  # groups (prompts) per training step
    group_size: Optional[int] = None  # must equal rollout_worker.rollout_repeat_n when set
    key_list: list[str] = field(default_factory=lambda: ["prompt"])
    check_batch_ready_function: str = "batch_size"
    group_timeout_s: float = 120.0
    incomplete_group_policy: str = "drop"  # drop | train_partial


@dataclass
class KlControl:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.0
    target_kl: float = 6.0
    horizon: int = 10000


@dataclass
class Algorithm:
    type: str = "grpo"  # an advantage estimator: grpo | dr_grpo | rloo | reinforce | registered
    batch_size: Optional[int] = None
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: Optional[float] = 3.0  # dual-clip cap for negative advantages; null turns it off
    loss_agg_mode: str = "token-mean"
    filter_zero_variance: bool = True
    do_old_log_prob_compute: bool = False
    off_policy_correction: str = "none"  # none | truncated_is | decoupled_ppo
    truncated_is_cap: float = 2.0
    use_kl_in_reward: bool = False
    use_kl_loss: bool = False
    kl_estimator: str = "k3"
    custom_advantage_module_path: Optional[str] = path_field()  # a .py file that calls register_advantage
    kl_ctrl: KlControl = field(default_factory=KlControl)


@dataclass
class Trainer:
    type: str = "grpo"  # grpo | cross_entropy | custom
    custom_trainer_module_path: Optional[str] = None  # "file.py:Class", a subclass of GRPOTrainer
    total_train_steps: int = 100
    total_epochs: Optional[int] = None  # stop after this many passes over the data, if sooner
    lr: float = 3e-4
    lr_schedule: str = "constant"  # constant | linear | cosine, over total_train_steps
    min_lr_ratio: float = 0.0  # the rate at the last step, as a fraction of lr
    lr_warmup_steps: int = 0  # linear ramp from 0 at the start of RL
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 8192
    warmup_cross_entropy_steps: int = 0
    warmup_batch_size: int = 64
    warmup_lr: Optional[float] = None
    warmup_messages_key: Optional[str] = None  # rows hold multi-turn demonstrations under this key
    num_threads: int = 1  # torch threads of the learner process
    checkpoint_path: str = "runs/${experiment_name}/checkpoints"
    save_freq: int = 10
    remove_previous_ckpt: bool = True
    seed: int = 0


@dataclass
class Weight:
    type: str = "default"
    sync_mode: str = "sync"  # sync | batch-async | fully-async
    staleness_threshold: int = 1
    sync_every: int = 1
    sync_weight_path: str = "runs/${experiment_name}/weights"


@dataclass
class ValidateEval:
    type: str = "default"
    compute_interval: int = 10


@dataclass
class Validate:
    validate_before_train: bool = True
    temperature: float = 0.0  # 0 = greedy
    data: Data = field(default_factory=Data)
    eval: ValidateEval = field(default_factory=ValidateEval)


@dataclass
class InferenceService:
    backend: str = "embedded"  # embedded | sglang | openai
    url: Optional[str] = None
    model_tag: str = "policy"
    api_key: Optional[str] = None
    max_retries: int = 3
    freeze_for_weight_sync: bool = True
    max_batch_size: int = 64


@dataclass
class Service:
    inference_service: InferenceService = field(default_factory=InferenceService)
    train_service: dict[str, Any] = field(default_factory=dict)


@dataclass
class Logger:
    backend: str = "console"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Recipe:
    project_name: str = "streamrl"
    experiment_name: str = "experiment"
    environment: Environment = field(default_factory=Environment)
    data: Data = field(default_factory=Data)
    rollout_worker: RolloutWorker = field(default_factory=RolloutWorker)
    trajectory_pool: TrajectoryPool = field(default_factory=TrajectoryPool)
    algorithm: Algorithm = field(default_factory=Algorithm)
    trainer: Trainer = field(default_factory=Trainer)
    weight: Weight = field(default_factory=Weight)
    validate: Validate = field(default_factory=Validate)
    service: Service = field(default_factory=Service)
    logger: Logger = field(default_factory=Logger)


# --- composition -----------------------------------------------------------------------

def _find_default(name: str, recipe_dir: Path) -> Path:
    for folder in (recipe_dir, *recipe_dir.parents):
        candidate = folder / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(name)


def compose(path: Path, _stack: tuple[Path, ...] = ()) -> Any:
    """The OmegaConf config of `path` with its `defaults:` merged in (unresolved)."""
    path = path.resolve()
    if path in _stack:
        raise RecipeError(path, [f"defaults: cycle {' -> '.join(p.name for p in (*_stack, path))}"])
    try:
        own = OmegaConf.load(path)
    except FileNotFoundError:
        raise RecipeError(path, ["file not found"]) from None
    except Exception as exc:  # YAML syntax
        raise RecipeError(path, [f"not valid YAML: {exc}"]) from None
    if not isinstance(own, typing.Mapping) and not OmegaConf.is_dict(own):
        raise RecipeError(path, ["a recipe must be a mapping of keys"])
    defaults = own.pop("defaults", [])
    parts, self_seen = [], False
    for i, entry in enumerate(defaults or []):
        if entry == "_self_":
            parts.append(own)
            self_seen = True
            continue
        if not isinstance(entry, str):
            raise RecipeError(path, [f"defaults[{i}]: expected a recipe name, got {entry!r}"])
        try:
            parts.append(compose(_find_default(entry, path.parent), (*_stack, path)))
        except FileNotFoundError:
            raise RecipeError(path, [f"defaults[{i}]: no {entry}.yaml next to the recipe or in its parent folders"]) from None
    if not self_seen:
        parts.append(own)
    return OmegaConf.merge(*parts) if parts else own


# --- checking --------------------------------------------------------------------------

def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _check_value(value, tp, key: str) -> list[str]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return []
        return _check_value(value, next(a for a in args if a is not type(None)), key)
    if tp is Any:
        return []
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            return [f"{key}: expected a mapping, got {type(value).__name__}"]
        return check_against(value, tp, key + ".")
    if origin is list:
        if not isinstance(value, list):
            return [f"{key}: expected a list, got {type(value).__name__} {value!r}"]
        return [p for i, v in enumerate(value) for p in _check_value(v, args[0], f"{key}[{i}]")]
    if origin is dict:
        return [] if isinstance(value, dict) else [f"{key}: expected a mapping, got {type(value).__name__}"]
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return []
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return []
    if tp in (str, bool) and isinstance(value, tp):
        return []
    return [f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}"]


_BOOLS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}


def _scalar_type(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else None
    return tp


def coerce_strings(values: dict, schema: type) -> None:
    """In place: strings (what `${oc.env:...}` always gives) become the key's int, float or
    bool when they parse as one; anything else is left for the checker to report."""
    hints = typing.get_type_hints(schema)
    for key, value in values.items():
        tp = _scalar_type(hints.get(key))
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            coerce_strings(value, tp)
        elif isinstance(value, str):
            try:
                if tp is int:
                    values[key] = int(value)
                elif tp is float:
                    values[key] = float(value)
                elif tp is bool and value.strip().lower() in _BOOLS:
                    values[key] = _BOOLS[value.strip().lower()]
            except ValueError:
                pass


def check_against(values: dict, schema: type, prefix: str = "") -> list[str]:
    problems = []
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            problems.append(f"{prefix}{key}: unknown key{hint}")
            continue
        problems += _check_value(value, hints[key], f"{prefix}{key}")
    return problems


def missing_files(values: dict, schema: type, base: Path, prefix: str = "") -> list[str]:
    problems = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        value = values.get(f.name)
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(value, dict):
            problems += missing_files(value, hints[f.name], base, f"{prefix}{f.name}.")
        elif f.metadata.get("path") and value:
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                where = f"{prefix}{f.name}" + (f"[{i}]" if isinstance(value, list) else "")
                if not (base / str(item)).exists():
                    problems.append(f"{where}: file not found: {item} (relative to {base})")
    return problems


def load_recipe(path: str | Path) -> dict:
    """The fully resolved recipe (schema defaults filled in), or RecipeError."""
    path = Path(path)
    composed = compose(path)
    try:
        merged = OmegaConf.merge(OmegaConf.create(dataclasses.asdict(Recipe())), composed)
        values = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        raise RecipeError(path, [f"{getattr(exc, 'full_key', '') or 'interpolation'}: {exc.msg if hasattr(exc, 'msg') else exc}"]) from None
    coerce_strings(values, Recipe)
    problems = check_against(values, Recipe)
    if values.get("rollout_worker", {}).get("custom_rollout_worker_module_path"):
        # a custom worker's own settings live in its section, as in the guide
        # (`self._config.use_few_shot`): its unknown keys are its own, not typos
        problems = [p for p in problems if not re.fullmatch(r"rollout_worker\.[^.\[]+: unknown key.*", p)]
    if not problems:
        problems = missing_files(values, Recipe, path.resolve().parent)
    if problems:
        raise RecipeError(path, problems)
    return values


# --- preparing a recipe to run -----------------------------------------------------------

def _absolute(value: str | None, base: Path) -> str | None:
    """A path relative to the recipe's folder made absolute; "file.py:Class" keeps its class.
    A value that names nothing on disk (a hub model id, say) is left alone."""
    if not value:
        return value
    path_text, sep, suffix = value.rpartition(":") if ".py:" in value else (value, "", "")
    candidate = (base / path_text)
    if not Path(path_text).is_absolute() and candidate.exists():
        return str(candidate.resolve()) + sep + suffix
    return value


def resolve_paths(values: dict, base: Path) -> dict:
    """Every file the recipe names, as an absolute path: the processes of a run read the
    resolved config from the ledger and may run from any folder."""
    for section in (values["data"], values["validate"]["data"]):
        section["data_files"] = [_absolute(f, base) for f in section["data_files"]]
    worker = values["rollout_worker"]
    for key in ("model_path", "tokenizer", "evaluator_module_path", "custom_rollout_worker_module_path",
                "agent_config_path", "agent_workspace"):
        worker[key] = _absolute(worker[key], base)
    values["trainer"]["custom_trainer_module_path"] = _absolute(values["trainer"]["custom_trainer_module_path"], base)
    values["algorithm"]["custom_advantage_module_path"] = _absolute(values["algorithm"]["custom_advantage_module_path"], base)
    values["environment"]["setup_script"] = _absolute(values["environment"]["setup_script"], base)
    return values


def consistency_problems(values: dict) -> list[str]:
    """Problems no single key shows: settings that contradict each other."""
    problems = []
    pool, worker = values["trajectory_pool"], values["rollout_worker"]
    if pool["group_size"] is not None and pool["group_size"] != worker["rollout_repeat_n"]:
        problems.append(f"trajectory_pool.group_size: {pool['group_size']} differs from "
                        f"rollout_worker.rollout_repeat_n ({worker['rollout_repeat_n']}), the samples per prompt")
    choices = {
        "weight.sync_mode": (values["weight"]["sync_mode"], ("sync", "batch-async", "fully-async")),
        "trainer.type": (values["trainer"]["type"], ("grpo", "cross_entropy", "custom")),
        "algorithm.loss_agg_mode": (values["algorithm"]["loss_agg_mode"], ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")),
        "algorithm.off_policy_correction": (values["algorithm"]["off_policy_correction"], ("none", "truncated_is", "decoupled_ppo")),
        "algorithm.kl_estimator": (values["algorithm"]["kl_estimator"], ("k1", "k2", "k3")),
        "trajectory_pool.incomplete_group_policy": (pool["incomplete_group_policy"], ("drop", "train_partial")),
        "data.type": (values["data"]["type"], ("jsonl", "parquet")),
        "trainer.lr_schedule": (values["trainer"]["lr_schedule"], LR_SCHEDULES),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            problems.append(f"{key}: expected one of {', '.join(allowed)}, got {value!r}")
    if values["trainer"]["type"] == "custom" and not values["trainer"]["custom_trainer_module_path"]:
        problems.append("trainer.custom_trainer_module_path: required when trainer.type is custom")
    if values["weight"]["staleness_threshold"] < 0:
        problems.append("weight.staleness_threshold: must be >= 0")
    if values["weight"]["sync_every"] != 1:
        problems.append("weight.sync_every: only 1 is supported (a weight version per step; the publisher paces by it)")
    if not 0.0 <= values["trainer"]["min_lr_ratio"] <= 1.0:
        problems.append("trainer.min_lr_ratio: must be between 0 and 1")
    if worker["rollout_repeat_n"] < 1:
        problems.append("rollout_worker.rollout_repeat_n: must be >= 1")
    return problems


def total_train_steps(recipe: dict, dataset_rows: int) -> int:
    """`trainer.total_train_steps`, or fewer when `trainer.total_epochs` passes over the
    data sooner (each step takes `trajectory_pool.batch_size` rows)."""
    trainer = recipe["trainer"]
    total = trainer["total_train_steps"]
    if trainer.get("total_epochs"):
        total = min(total, math.ceil(trainer["total_epochs"] * dataset_rows / recipe["trajectory_pool"]["batch_size"]))
    return total


def run_setup_script(path: str | Path) -> None:
    """Run the recipe's `environment.setup_script` (a Python file, in the recipe's folder),
    which prepares what the recipe needs (data, a model) before anything is checked."""
    path = Path(path)
    composed = compose(path)
    script = OmegaConf.select(composed, "environment.setup_script", default=None)
    if not script:
        return
    script_path = (path.resolve().parent / str(script)).resolve()
    if not script_path.is_file():
        raise RecipeError(path, [f"environment.setup_script: file not found: {script}"])
    result = subprocess.run([sys.executable, str(script_path)], cwd=script_path.parent,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RecipeError(path, [f"environment.setup_script: {script} exited {result.returncode}: "
                                 f"{(result.stderr or result.stdout).strip()[-2000:]}"])


def apply_env_script(path: str | Path) -> dict[str, str]:
    """Source the recipe's `environment.env_script` (bash, `set -a`) and take the variables
    it sets into this process's environment, so `${oc.env:...}` and the set-up script see
    them. A variable already set keeps its value when the script writes `${VAR:-default}`,
    the usual form. Returns what changed."""
    path = Path(path)
    script = OmegaConf.select(compose(path), "environment.env_script", default=None)
    if not script:
        return {}
    script_path = (path.resolve().parent / str(script)).resolve()
    if not script_path.is_file():
        raise RecipeError(path, [f"environment.env_script: file not found: {script}"])
    result = subprocess.run(["bash", "-c", 'set -a; . "$0" >&2; env -0', str(script_path)],
                            cwd=script_path.parent, capture_output=True, text=True)
    if result.returncode != 0:
        raise RecipeError(path, [f"environment.env_script: {script} exited {result.returncode}: "
                                 f"{result.stderr.strip()[-2000:]}"])
    changed = {}
    for entry in result.stdout.split("\0"):
        name, sep, value = entry.partition("=")
        if sep and name and os.environ.get(name) != value and name not in ("_", "SHLVL", "PWD", "OLDPWD"):
            changed[name] = value
    os.environ.update(changed)
    return changed


def prepare_recipe(path: str | Path, run_setup: bool = True) -> dict:
    """Env script, set-up script, load, check consistency, absolute paths: what a run starts from."""
    path = Path(path)
    apply_env_script(path)
    if run_setup:
        run_setup_script(path)
    values = load_recipe(path)
    problems = consistency_problems(values)
    if problems:
        raise RecipeError(path, problems)
    return resolve_paths(values, path.resolve().parent)
