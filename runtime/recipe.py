"""Recipes: YAML files with `defaults:` composition and `${oc.env:VAR,default}`
interpolation (OmegaConf), checked against a typed schema whose keys follow the NexRL
user guide (project_name, experiment_name, data, rollout_worker, trajectory_pool,
trainer, algorithm, weight, validate, service, logger).

`load_recipe(path)` returns the typed `Recipe` (runtime/config.py), or raises
`RecipeError` listing every problem with its key path: unknown keys (with the closest
known one), wrong types, refused values, missing files.

Composition: `defaults: [common/base, _self_]` merges `common/base.yaml` (looked up
next to the recipe, then in its parent folders) and then the recipe itself; where
`_self_` stands decides which side wins, as in Hydra.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from streamrl.runtime.config import Recipe, check_against, coerce_strings, missing_files
from streamrl.runtime.dataset import DatasetError, data_section_problems, data_type_problems, resolve_chat_template
from streamrl.runtime.guide_forms import apply_guide_forms
from streamrl.runtime.prompt_lengths import overlong_rows
from streamrl.runtime.service_config import TinkerService, runs_ahead, window_problems
from streamrl.runtime.verl_keys import apply_verl_keys
from streamrl.runtime.weight_transport import transport_problems


class RecipeError(ValueError):
    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = path, problems
        super().__init__(f"{path}: " + ("\n  " if len(problems) > 1 else "") + "\n  ".join(problems))


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
    defaults = own.pop("defaults", [])  # type: ignore[call-arg,arg-type]  # `own` is a mapping here (checked above)
    if defaults is not None and not (isinstance(defaults, list) or OmegaConf.is_list(defaults)):
        raise RecipeError(path, [f"defaults: expected a list of recipe names, got {defaults!r}"[:200]])
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


def section_shape_problems(values: dict, schema: type, prefix: str = "") -> list[str]:
    """Sections (`trainer:`, `data:`, ...) given as something other than a mapping: said
    before merging, which would otherwise fail without naming the key."""
    hints = typing.get_type_hints(schema)
    problems = []
    for key, value in values.items():
        tp = hints.get(key) if isinstance(key, str) else None
        if not isinstance(tp, type) or not dataclasses.is_dataclass(tp):
            continue
        if isinstance(value, dict):
            problems += section_shape_problems(value, tp, f"{prefix}{key}.")
        else:
            problems.append(f"{prefix}{key}: expected a mapping of keys, got {type(value).__name__} {value!r}"[:200])
    return problems


def parse_overrides(overrides: list[str] | None) -> dict:
    """`key.path=value` arguments (values read as YAML: 1e-4, true, [a, b]) as a mapping."""
    problems = [
        f"{item!r}: expected key.path=value" for item in overrides or [] if "=" not in item or not item.split("=", 1)[0].strip()
    ]
    if problems:
        raise RecipeError(Path("command line"), problems)
    try:
        return typing.cast(dict[str, Any], OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides or [])), resolve=False))
    except OmegaConfBaseException as exc:
        raise RecipeError(Path("command line"), [str(exc).splitlines()[0]]) from None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """The fully resolved, typed recipe (defaults filled in, then the command line's
    `key=value` overrides), or RecipeError."""
    path = Path(path)
    own = typing.cast(dict[str, Any], OmegaConf.to_container(compose(path), resolve=False))  # a mapping: compose checks
    problems = section_shape_problems(own, Recipe)
    if problems:
        raise RecipeError(path, problems)
    guide_problems = apply_verl_keys(own) + apply_guide_forms(own)  # the guide's spellings moved to StreamRL's keys
    override_values = parse_overrides(overrides)
    if "environment" in override_values:
        guide_problems.append("command line: environment.*: the scripts run before the recipe is read; set them in the recipe")
    guide_problems += [f"command line: {p}" for p in apply_verl_keys(override_values) + apply_guide_forms(override_values)]
    shape = section_shape_problems(override_values, Recipe)
    if shape:
        raise RecipeError(path, guide_problems + [f"command line: {p}" for p in shape])
    try:
        merged = OmegaConf.merge(OmegaConf.create(Recipe().to_dict()), OmegaConf.create(own), OmegaConf.create(override_values))
        values = typing.cast(dict[str, Any], OmegaConf.to_container(merged, resolve=True))
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
        key = getattr(exc, "full_key", "") or "interpolation"
        raise RecipeError(path, [f"{key}: {exc.msg if hasattr(exc, 'msg') else exc}"]) from None
    coerce_strings(values, Recipe)
    problems = guide_problems + check_against(values, Recipe)
    problems += data_type_problems(values, tuple(path_bases(path.resolve().parent)))
    custom = {
        "rollout_worker": (values.get("rollout_worker") or {}).get("custom_rollout_worker_module_path"),
        "algorithm": (values.get("trainer") or {}).get("custom_trainer_module_path"),
    }
    for section, custom_code in custom.items():
        if custom_code:
            # a custom worker's or trainer's own settings live in its section, as in the
            # guide (`self._config.use_few_shot`, `config.algorithm.my_param`): its
            # unknown keys are its own, not typos
            problems = [p for p in problems if not re.fullmatch(rf"{section}\.[^.\[]+: unknown key.*", p)]
    problems += missing_files(values, Recipe, path_bases(path.resolve().parent))
    if problems:
        raise RecipeError(path, problems)
    return with_derived_defaults(Recipe.from_dict(values))


def with_derived_defaults(recipe: Recipe) -> Recipe:
    """Defaults that follow from other keys, written in, so that the run's recorded
    config says what every process used."""
    algorithm = recipe.algorithm
    if algorithm.loss_agg_mode == "seq-mean-token-sum-norm" and algorithm.loss_scale_factor is None:
        algorithm.loss_scale_factor = float(recipe.rollout_worker.max_response_length)
    return recipe


# --- preparing a recipe to run -----------------------------------------------------------


def path_bases(recipe_dir: Path) -> list[Path]:
    """Where a recipe's relative paths are looked up: its own folder, then the working
    directory (the guide writes them from the repository's root: recipe/my_task/...)."""
    return [recipe_dir, Path.cwd()]


@typing.overload
def _absolute(value: str, base: Path) -> str: ...
@typing.overload
def _absolute(value: None, base: Path) -> None: ...
def _absolute(value: str | None, base: Path) -> str | None:
    """A relative path made absolute (looked up in `path_bases`); "file.py:Class" keeps
    its class. A value that names nothing on disk (a hub model id, say) is left alone."""
    if not value:
        return value
    path_text, sep, suffix = value.rpartition(":") if ".py:" in value else (value, "", "")
    if Path(path_text).is_absolute():
        return value
    for folder in path_bases(base):
        if (folder / path_text).exists():
            return str((folder / path_text).resolve()) + sep + suffix
    return value


def resolve_paths(recipe: Recipe, base: Path) -> Recipe:
    """Every file the recipe names, as an absolute path: the processes of a run read the
    resolved config from the ledger and may run from any folder."""
    for section in (recipe.data, recipe.validate.data):
        section.data_files = [_absolute(f, base) for f in section.data_files]
    worker = recipe.rollout_worker
    for key in (
        "model_path",
        "evaluator_module_path",
        "custom_rollout_worker_module_path",
        "agent_config_path",
        "agent_workspace",
        "agent_loop_config_path",
        "tool_config_path",
        "interaction_config_path",
    ):
        setattr(worker, key, _absolute(getattr(worker, key), base))
    recipe.trainer.custom_trainer_module_path = _absolute(recipe.trainer.custom_trainer_module_path, base)
    recipe.algorithm.custom_advantage_module_path = _absolute(recipe.algorithm.custom_advantage_module_path, base)
    recipe.environment.setup_script = _absolute(recipe.environment.setup_script, base)
    recipe.environment.env_script = _absolute(recipe.environment.env_script, base)
    if worker.trace_path and not Path(worker.trace_path).is_absolute():  # as the guide: from where the run starts
        worker.trace_path = str(Path.cwd() / worker.trace_path)
    try:  # the template's text: every process renders with the same one, and the ledger records it
        recipe.data.chat_template = resolve_chat_template(recipe.data.chat_template, path_bases(base))
    except DatasetError as exc:
        raise RecipeError(base, [str(exc)]) from None
    return recipe


def _script(path: Path, key: str) -> Path | None:
    """The file `environment.<key>` names (in the recipe's folder or the working
    directory), or None when the recipe names none."""
    script = OmegaConf.select(compose(path), f"environment.{key}", default=None)
    if not script:
        return None
    for base in path_bases(path.resolve().parent):
        if (base / str(script)).is_file():
            return (base / str(script)).resolve()
    raise RecipeError(path, [f"environment.{key}: file not found: {script}"])


def run_setup_script(path: str | Path) -> None:
    """Run the recipe's `environment.setup_script` when it is a Python file (in its own
    folder), which prepares what the recipe needs (data, a model) before anything is
    checked. A `.sh` set-up script is the guide's env file: `apply_env_script` sources it."""
    path = Path(path)
    script_path = _script(path, "setup_script")
    if script_path is None or script_path.suffix == ".sh":
        return
    result = subprocess.run([sys.executable, str(script_path)], cwd=script_path.parent, capture_output=True, text=True)
    if result.returncode != 0:
        raise RecipeError(
            path,
            [
                f"environment.setup_script: {script_path.name} exited {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()[-2000:]}"
            ],
        )


def apply_env_script(path: str | Path) -> dict[str, str]:
    """Source the recipe's `environment.env_script` (and a `.sh` `setup_script`, the
    guide's env file) in bash with `set -a`, and take the variables it sets into this
    process's environment, so `${oc.env:...}` and the set-up script see them. A variable
    already set keeps its value when the script writes `${VAR:-default}`, the usual form.
    Returns what changed."""
    path = Path(path)
    scripts = []
    for key in ("env_script", "setup_script"):
        script = _script(path, key)
        if script is not None and (key == "env_script" or script.suffix == ".sh"):
            scripts.append((key, script))
    changed = {}
    for key, script_path in scripts:
        result = subprocess.run(
            ["bash", "-c", 'set -a; . "$0" >&2; env -0', str(script_path)], cwd=script_path.parent, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RecipeError(
                path, [f"environment.{key}: {script_path.name} exited {result.returncode}: {result.stderr.strip()[-2000:]}"]
            )
        for entry in result.stdout.split("\0"):
            name, sep, value = entry.partition("=")
            if sep and name and os.environ.get(name) != value and name not in ("_", "SHLVL", "PWD", "OLDPWD"):
                changed[name] = value
        os.environ.update(changed)
    return changed


def consistency_problems(recipe: Recipe) -> list[str]:
    """Problems no single key shows: settings that contradict each other or are out of range."""
    problems = []
    pool, worker = recipe.trajectory_pool, recipe.rollout_worker
    if recipe.algorithm.batch_size is not None and recipe.algorithm.batch_size != pool.batch_size:
        problems.append(
            f"algorithm.batch_size: {recipe.algorithm.batch_size} differs from trajectory_pool.batch_size "
            f"({pool.batch_size}), the groups per step"
        )
    if pool.group_size is not None and pool.group_size != worker.rollout_repeat_n:
        problems.append(
            f"trajectory_pool.group_size: {pool.group_size} differs from "
            f"rollout_worker.rollout_repeat_n ({worker.rollout_repeat_n}), the samples per prompt"
        )
    if recipe.trainer.type in ("custom", "self_hosted") and not recipe.trainer.custom_trainer_module_path:
        problems.append(
            f"trainer.custom_trainer_module_path: required when trainer.type is {recipe.trainer.type} "
            "(the file of your trainer class)"
        )
    problems += remote_training_problems(recipe)
    # ranges are on the fields themselves (runtime/config.py) and checked with the types
    if recipe.algorithm.do_old_log_prob_compute and recipe.trainer.nproc_per_node * recipe.trainer.nnodes > 1:
        problems.append(
            "algorithm.do_old_log_prob_compute: with one learner process only (the recomputation runs "
            "where the step is prepared, on rank 0, and a sharded model needs every rank)"
        )
    if recipe.trainer.custom_trainer_class_name and not recipe.trainer.custom_trainer_module_path:
        problems.append("trainer.custom_trainer_class_name: needs trainer.custom_trainer_module_path (the file)")
    elif recipe.trainer.custom_trainer_class_name and ".py:" in (recipe.trainer.custom_trainer_module_path or ""):
        problems.append(
            "trainer.custom_trainer_class_name: the module path names a class already "
            "(file.py:Class); give the class in one place"
        )
    if worker.trace_path and not worker.save_trace:
        problems.append("rollout_worker.trace_path: traces are written only with save_trace: true")
    problems += algorithm_number_problems(recipe.algorithm) + data_section_problems(recipe)
    problems += window_problems(recipe.service.broker, runs_ahead(recipe), recipe.trainer.save_freq)
    return problems + inference_service_problems(recipe) + transport_problems(recipe)


def algorithm_number_problems(algorithm) -> list[str]:
    """The maths' numeric keys set only where something reads them (their ranges are on
    the fields)."""
    problems = []
    if algorithm.loss_scale_factor is not None and algorithm.loss_agg_mode != "seq-mean-token-sum-norm":
        problems.append(
            f"algorithm.loss_scale_factor: read only by loss_agg_mode seq-mean-token-sum-norm "
            f"(this recipe's is {algorithm.loss_agg_mode})"
        )
    if algorithm.grpo_std_epsilon != 1e-6 and algorithm.type != "grpo":
        problems.append(f"algorithm.grpo_std_epsilon: read only by algorithm.type grpo (this recipe's is {algorithm.type})")
    return problems


# Which inference backends read which `service.inference_service` keys (the rest: all).
SERVER_KEYS = {
    "url": ("sglang", "openai"),
    "api_key": ("sglang", "openai"),
    "num_servers": ("sglang",),
    "server_args": ("sglang",),
    "partial_rollout": ("sglang",),
    "startup_timeout_s": ("sglang",),
    "weight_sync_timeout_s": ("sglang",),
    "model_tag": ("openai",),
    "allow_text_round_trip": ("openai",),
    "allow_unsynced_weights": ("openai",),
}


MANAGED_ONLY = ("num_servers", "server_args", "startup_timeout_s")


def inference_service_problems(recipe: Recipe) -> list[str]:
    """A key that the chosen backend would not read is refused, not ignored."""
    service = recipe.service.inference_service
    defaults = type(service)()
    prefix = "service.inference_service."
    problems = [
        f"{prefix}{key}: not used by backend {service.backend} (only by {' and '.join(backends)})"
        for key, backends in SERVER_KEYS.items()
        if service.backend not in backends and getattr(service, key) != getattr(defaults, key)
    ]
    if service.backend == "openai" and not service.url:
        problems.append(f"{prefix}url: backend openai needs the server's url")
    if service.url:
        problems += [
            f"{prefix}{key}: for managed servers only; with url the servers are the ones listed"
            for key in MANAGED_ONLY
            if getattr(service, key) != getattr(defaults, key)
        ]
    if service.partial_rollout and recipe.weight.sync_mode != "fully-async":
        problems.append(
            f"{prefix}partial_rollout: only weight.sync_mode fully-async interrupts requests "
            f"for a weight update (this recipe: {recipe.weight.sync_mode})"
        )
    if service.num_servers < 1 or service.max_batch_size < 1 or service.max_retries < 0:
        problems.append(f"{prefix}num_servers, max_batch_size: must be >= 1; max_retries: >= 0")
    return problems


def server_urls(url: str | list[str] | None) -> list[str]:
    """`url:` (one or a list; `host:port` as the guide's CLI writes it) as http URLs."""
    urls = [url] if isinstance(url, str) else list(url or [])
    return [(u if "://" in u else f"http://{u}").rstrip("/") for u in urls]


def with_inference_url(recipe: Recipe, urls: list[str]) -> Recipe:
    """The recipe with `--inference-url`: these servers replace the managed ones the
    recipe describes (and with them `num_servers`, `server_args`, `startup_timeout_s`)."""
    service = recipe.service.inference_service
    if service.backend not in SERVER_KEYS["url"]:
        raise RecipeError(
            Path("--inference-url"),
            [f"service.inference_service.backend is {service.backend}: an inference url needs backend sglang or openai"],
        )
    defaults = type(service)()
    service = dataclasses.replace(service, url=server_urls(urls), **{key: getattr(defaults, key) for key in MANAGED_ONLY})
    return dataclasses.replace(recipe, service=dataclasses.replace(recipe.service, inference_service=service))


def prepare_recipe(path: str | Path, run_setup: bool = True, overrides: list[str] | None = None) -> Recipe:
    """Env script, set-up script, load (with the command line's `key=value` overrides),
    check consistency, absolute paths: what a run starts from."""
    path = Path(path)
    apply_env_script(path)
    if run_setup:
        run_setup_script(path)
    recipe = load_recipe(path, overrides)
    problems = consistency_problems(recipe)
    if problems:
        raise RecipeError(path, problems)
    recipe = resolve_paths(recipe, path.resolve().parent)
    if recipe.data.template_date is None:  # pinned, and recorded with the run
        recipe.data.template_date = datetime.date.today().isoformat()
    if recipe.data.filter_overlong_prompts:
        try:
            recipe.data.skip_rows = overlong_rows(recipe)
        except DatasetError:
            pass  # unreadable rows: `recipe validate` and the run's row checks name them
    return recipe


REMOTE_TRAINER_TYPES = ("remote_api_grpo", "remote_api_cross_entropy")


def remote_training_problems(recipe: Recipe) -> list[str]:
    """A remote_api_* trainer trains through service.train_service (a Tinker-compatible API);
    what only a local learner can do is refused with the reason."""
    trainer, service = recipe.trainer, recipe.service.train_service
    remote = trainer.type in REMOTE_TRAINER_TYPES
    if not remote:
        problems = (
            [
                f"service.train_service.backend: {service.backend} is for trainer.type remote_api_grpo or "
                f"remote_api_cross_entropy (the trainer is {trainer.type})"
            ]
            if service.backend != "none"
            else []
        )
        if recipe.service.tinker_service != TinkerService():
            problems.append(f"service.tinker_service: read only by a remote_api_* trainer (the trainer is {trainer.type})")
        return problems
    problems = []
    if service.backend != "tinker" or not service.url:
        problems.append(
            f"trainer.type: {trainer.type} trains through a remote training service: set "
            "service.train_service.backend: tinker and service.train_service.url (e.g. a "
            "`streamrl serve-training`)"
        )
    why = "the model lives in the training service, not in this process"
    for key, value in (
        ("algorithm.use_kl_loss", recipe.algorithm.use_kl_loss),
        ("algorithm.use_kl_in_reward", recipe.algorithm.use_kl_in_reward),
        ("algorithm.do_old_log_prob_compute", recipe.algorithm.do_old_log_prob_compute),
    ):
        if value:
            problems.append(f"{key}: not available with trainer.type {trainer.type} ({why})")
    if trainer.nproc_per_node != 1 or trainer.nnodes != 1:
        problems.append(
            f"trainer.nproc_per_node / nnodes: a {trainer.type} trainer is one client process; the service decides its own GPUs"
        )
    if service.config.loss_fn not in (None, "importance_sampling", "ppo", "cispo", "cross_entropy"):
        problems.append(
            f"service.train_service.config.loss_fn: {service.config.loss_fn!r} is not one of "
            "importance_sampling, ppo, cispo, cross_entropy"
        )
    if recipe.service.tinker_service.lora_rank < 0:
        problems.append("service.tinker_service.lora_rank: must be >= 0 (0: full fine-tuning)")
    return problems
