"""The guide's remote-API trainers: a step's trajectories become the Tinker API's datums
and train on a remote training service (`streamrl serve-training`, or Tinker itself).

    RemoteApiTrainer               override `_prepare_trajectories(trajectories, metrics)`
    RemoteApiGrpoTrainer           trainer.type remote_api_grpo: GRPO advantages by run_id
    RemoteApiCrossEntropyTrainer   trainer.type remote_api_cross_entropy: supervised

A datum is one sequence shifted by one (the API's layout: input t predicts target t):
`target_tokens`, the sampler's `logprobs`, per-token `advantages` (0 on the prompt) and
`weights` (the loss mask). The API's losses are sums over tokens; each datum's
advantages (or weights) are scaled by `algorithm.loss_agg_mode`'s divisor, so the
remote step optimises the same objective the self-hosted learner does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from streamrl.algos.advantages import GRPO_EPSILON
from streamrl.learner.batching import TrainItem
from streamrl.learner.step_metrics import log_grpo_metrics, log_rollout_metrics
from streamrl.learner.trainers import (
    CUSTOM_TRAINER_TYPES,
    TRAINERS,
    Trainer,
    compute_grpo_advantage_for_trajectories,
    register_trainer,
)
from streamrl.runtime.config import Recipe
from streamrl.runtime.plugins import LoadError, load_class


class RemoteApiTrainer:
    """Built as `cls(config)` with the whole recipe (OmegaConf); trains through the service."""

    name = "remote_api"
    loss_fn = "importance_sampling"  # the default of service.train_service.config.loss_fn

    def __init__(self, config):
        self._config = config
        self.algorithm = config.algorithm

    def _prepare_trajectories(self, trajectories: list[TrainItem], metrics: dict) -> list[TrainItem]:
        raise NotImplementedError(f"{type(self).__name__}._prepare_trajectories(trajectories, metrics)")

    def prepare(self, items: list[TrainItem]) -> tuple[list[TrainItem], dict[str, float]]:
        metrics: dict[str, float] = {}
        log_rollout_metrics(items, metrics)
        items = self._prepare_trajectories(list(items), metrics)
        if not items:
            raise ValueError("_prepare_trajectories left no trajectories to train on")
        return items, {key: float(value) for key, value in metrics.items()}


class RemoteApiGrpoTrainer(RemoteApiTrainer):
    name = "remote_api_grpo"

    def _prepare_trajectories(self, trajectories, metrics):
        algorithm = self.algorithm
        trajectories = compute_grpo_advantage_for_trajectories(
            trajectories,
            use_run_ids=True,
            estimator=algorithm.get("type") or "grpo",
            std_epsilon=algorithm.get("grpo_std_epsilon") or GRPO_EPSILON,
        )
        log_grpo_metrics(trajectories, metrics)
        return trajectories


class RemoteApiCrossEntropyTrainer(RemoteApiTrainer):
    name = "remote_api_cross_entropy"
    loss_fn = "cross_entropy"

    def _prepare_trajectories(self, trajectories, metrics):
        return trajectories


for _cls in (RemoteApiGrpoTrainer, RemoteApiCrossEntropyTrainer):
    register_trainer(_cls.name)(_cls)


def aggregation_scales(masks: list[np.ndarray], mode: str, loss_scale_factor: float | None = None) -> list[float]:
    """Per datum, what its summed loss is multiplied by so that the sum over datums is the
    recipe's aggregation (token-mean: / all trained tokens; token-sum: 1; seq-mean-token-sum:
    / sequences; seq-mean-token-mean: / (sequences x the sequence's tokens);
    seq-mean-token-sum-norm: / (sequences x loss_scale_factor))."""
    tokens = [max(float(mask.sum()), 1.0) for mask in masks]
    if mode == "token-mean":
        return [1.0 / sum(tokens)] * len(masks)
    if mode == "token-sum":
        return [1.0] * len(masks)
    if mode == "seq-mean-token-sum":
        return [1.0 / len(masks)] * len(masks)
    if mode == "seq-mean-token-mean":
        return [1.0 / (len(masks) * n) for n in tokens]
    if mode == "seq-mean-token-sum-norm" and loss_scale_factor:
        return [1.0 / (len(masks) * loss_scale_factor)] * len(masks)
    raise ValueError(f"algorithm.loss_agg_mode: {mode!r} has no remote form")


def datum_arrays(item: TrainItem, loss_fn: str, scale: float) -> dict[str, np.ndarray]:
    """One sample as the API's arrays (input, targets and loss inputs, all length T - 1)."""
    mask = item.mask[1:].astype(np.float32)
    arrays: dict[str, np.ndarray] = {
        "model_input": item.tokens[:-1].astype(np.int64),
        "target_tokens": item.tokens[1:].astype(np.int64),
    }
    if loss_fn == "cross_entropy":
        arrays["weights"] = mask * scale
        return arrays
    advantages = item.token_advantages[1:] if item.token_advantages is not None else np.full(len(mask), item.advantage)
    arrays["logprobs"] = item.behaviour_logprobs[1:].astype(np.float32)
    arrays["advantages"] = (advantages * mask * scale).astype(np.float32)
    return arrays


def service_datums(items: list[TrainItem], loss_fn: str, loss_agg_mode: str, loss_scale_factor: float | None = None) -> list:
    """The step's samples as the Tinker API's `Datum`s (the client's own types)."""
    from tinker import types  # imported here: two seconds that only a remote trainer pays

    scales = aggregation_scales([item.mask[1:] for item in items], loss_agg_mode, loss_scale_factor)
    data = []
    for item, scale in zip(items, scales):
        arrays = datum_arrays(item, loss_fn, scale)
        model_input = types.ModelInput.from_ints(arrays.pop("model_input").tolist())
        data.append(
            types.Datum(model_input=model_input, loss_fn_inputs={k: types.TensorData.from_numpy(v) for k, v in arrays.items()})
        )
    return data


def request_chunks(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices of the datums in consecutive requests of at most `max_tokens` tokens each
    (a longer datum goes alone). The service sums the gradients of a step's
    forward_backward requests until its optim_step, so the step is the same whatever the
    split. Pure."""
    chunks: list[list[int]] = []
    size = 0
    for index, length in enumerate(lengths):
        if chunks and size + length <= max_tokens:
            chunks[-1].append(index)
            size += length
        else:
            chunks.append([index])
            size = length
    return chunks


def merged_metrics(parts: list[dict]) -> dict[str, float]:
    """One step's metrics from its requests', by the reduction their names end with
    (Tinker's convention: `loss:sum`, `x:max`, `x:min`; otherwise the mean). Pure."""
    reduce: dict[str, Callable[[list[float]], float]] = {"sum": sum, "max": max, "min": min}
    keys = {key for part in parts for key in part}
    return {
        key: float(
            reduce.get(key.rpartition(":")[2], lambda v: sum(v) / len(v))([float(part[key]) for part in parts if key in part])
        )
        for key in keys
    }


def trainer_class(recipe: Recipe) -> type[Trainer] | type[RemoteApiTrainer]:
    """The trainer class a recipe names: registered, or its own (self-hosted or remote).
    Here, the one module that knows both kinds, and light enough for recipe validation
    (no model code)."""
    cfg = recipe.trainer
    if cfg.type in CUSTOM_TRAINER_TYPES or cfg.custom_trainer_module_path:
        spec = cfg.custom_trainer_module_path or ""
        if cfg.custom_trainer_class_name:  # the guide's form: the file and the class apart
            spec = f"{spec}:{cfg.custom_trainer_class_name}"
        cls = load_class(spec, ".")
        if not issubclass(cls, (Trainer, RemoteApiTrainer)):
            raise LoadError(
                f"{spec!r}: {cls.__name__} is not a subclass of Trainer (a self-hosted trainer) or "
                "RemoteApiTrainer (trained through service.train_service)"
            )
        remote_type = cfg.type.startswith("remote_api_")
        if remote_type and not issubclass(cls, RemoteApiTrainer):
            raise LoadError(
                f"{spec!r}: {cls.__name__} trains here (a self-hosted Trainer), and trainer.type {cfg.type} trains "
                "through service.train_service: use trainer.type custom with it, or a RemoteApiTrainer subclass"
            )
        if issubclass(cls, RemoteApiTrainer) and not remote_type:
            raise LoadError(
                f"{spec!r}: {cls.__name__} is a RemoteApiTrainer, which trains through service.train_service: "
                f"set trainer.type remote_api_grpo or remote_api_cross_entropy (it is {cfg.type})"
            )
        return cls
    return TRAINERS.get(cfg.type)
