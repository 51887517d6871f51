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
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runtime.config import Recipe, check_against, coerce_strings, missing_files


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
    defaults = own.pop("defaults", [])
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
        if tp is None or not dataclasses.is_dataclass(tp):
            continue
        if isinstance(value, dict):
            problems += section_shape_problems(value, tp, f"{prefix}{key}.")
        else:
            problems.append(f"{prefix}{key}: expected a mapping of keys, got {type(value).__name__} {value!r}"[:200])
    return problems


def load_recipe(path: str | Path) -> Recipe:
    """The fully resolved, typed recipe (defaults filled in), or RecipeError."""
    path = Path(path)
    composed = compose(path)
    problems = section_shape_problems(OmegaConf.to_container(composed, resolve=False), Recipe)
    if problems:
        raise RecipeError(path, problems)
    try:
        merged = OmegaConf.merge(OmegaConf.create(Recipe().to_dict()), composed)
        values = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
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
    return Recipe.from_dict(values)


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


def resolve_paths(recipe: Recipe, base: Path) -> Recipe:
    """Every file the recipe names, as an absolute path: the processes of a run read the
    resolved config from the ledger and may run from any folder."""
    for section in (recipe.data, recipe.validate.data):
        section.data_files = [_absolute(f, base) for f in section.data_files]
    worker = recipe.rollout_worker
    for key in ("model_path", "evaluator_module_path", "custom_rollout_worker_module_path",
                "agent_config_path", "agent_workspace"):
        setattr(worker, key, _absolute(getattr(worker, key), base))
    recipe.trainer.custom_trainer_module_path = _absolute(recipe.trainer.custom_trainer_module_path, base)
    recipe.algorithm.custom_advantage_module_path = _absolute(recipe.algorithm.custom_advantage_module_path, base)
    recipe.environment.setup_script = _absolute(recipe.environment.setup_script, base)
    return recipe


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


def consistency_problems(recipe: Recipe) -> list[str]:
    """Problems no single key shows: settings that contradict each other or are out of range."""
    problems = []
    pool, worker = recipe.trajectory_pool, recipe.rollout_worker
    if pool.group_size is not None and pool.group_size != worker.rollout_repeat_n:
        problems.append(f"trajectory_pool.group_size: {pool.group_size} differs from "
                        f"rollout_worker.rollout_repeat_n ({worker.rollout_repeat_n}), the samples per prompt")
    if recipe.trainer.type == "custom" and not recipe.trainer.custom_trainer_module_path:
        problems.append("trainer.custom_trainer_module_path: required when trainer.type is custom")
    if recipe.weight.staleness_threshold < 0:
        problems.append("weight.staleness_threshold: must be >= 0")
    if not 0.0 <= recipe.trainer.min_lr_ratio <= 1.0:
        problems.append("trainer.min_lr_ratio: must be between 0 and 1")
    if worker.rollout_repeat_n < 1:
        problems.append("rollout_worker.rollout_repeat_n: must be >= 1")
    if pool.batch_size < 1:
        problems.append("trajectory_pool.batch_size: must be >= 1")
    if recipe.trainer.nproc_per_node < 1 or recipe.trainer.nnodes < 1:
        problems.append("trainer.nproc_per_node / trainer.nnodes: must be >= 1")
    return problems + inference_service_problems(recipe)


# Which inference backends read which `service.inference_service` keys (the rest: all).
SERVER_KEYS = {"url": ("sglang", "openai"), "api_key": ("sglang", "openai"), "num_servers": ("sglang",),
               "server_args": ("sglang",), "partial_rollout": ("sglang",), "startup_timeout_s": ("sglang",),
               "weight_sync_timeout_s": ("sglang",), "model_tag": ("openai",),
               "allow_text_round_trip": ("openai",), "allow_unsynced_weights": ("openai",)}


MANAGED_ONLY = ("num_servers", "server_args", "startup_timeout_s")


def inference_service_problems(recipe: Recipe) -> list[str]:
    """A key that the chosen backend would not read is refused, not ignored."""
    service = recipe.service.inference_service
    defaults = type(service)()
    prefix = "service.inference_service."
    problems = [f"{prefix}{key}: not used by backend {service.backend} (only by {' and '.join(backends)})"
                for key, backends in SERVER_KEYS.items()
                if service.backend not in backends and getattr(service, key) != getattr(defaults, key)]
    if service.backend == "openai" and not service.url:
        problems.append(f"{prefix}url: backend openai needs the server's url")
    if service.url:
        problems += [f"{prefix}{key}: for managed servers only; with url the servers are the ones listed"
                     for key in MANAGED_ONLY if getattr(service, key) != getattr(defaults, key)]
    if service.partial_rollout and recipe.weight.sync_mode != "fully-async":
        problems.append(f"{prefix}partial_rollout: only weight.sync_mode fully-async interrupts requests "
                        f"for a weight update (this recipe: {recipe.weight.sync_mode})")
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
        raise RecipeError("--inference-url", [f"service.inference_service.backend is {service.backend}: an "
                                              "inference url needs backend sglang or openai"])
    defaults = type(service)()
    service = dataclasses.replace(service, url=server_urls(urls),
                                  **{key: getattr(defaults, key) for key in MANAGED_ONLY})
    return dataclasses.replace(recipe, service=dataclasses.replace(recipe.service, inference_service=service))


def prepare_recipe(path: str | Path, run_setup: bool = True) -> Recipe:
    """Env script, set-up script, load, check consistency, absolute paths: what a run starts from."""
    path = Path(path)
    apply_env_script(path)
    if run_setup:
        run_setup_script(path)
    recipe = load_recipe(path)
    problems = consistency_problems(recipe)
    if problems:
        raise RecipeError(path, problems)
    return resolve_paths(recipe, path.resolve().parent)
