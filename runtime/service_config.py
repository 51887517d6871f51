"""The recipe's `service:` section: where rollouts are sampled (inference_service) and,
for remote_api_* trainers, where the model trains (train_service, tinker_service)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from runtime.config_fields import only


@dataclass
class InferenceService:
    """Where rollouts are sampled (`runtime/recipe.py` checks which keys each backend reads)."""
    backend: str = "embedded"  # a registered inference backend: embedded | sglang | openai
    url: Optional[Union[str, list[str]]] = None  # external server(s); sglang without one: managed servers
    num_servers: int = 1  # managed sglang servers per rollout worker
    server_args: dict[str, Any] = field(default_factory=dict)  # managed sglang: launch flags (mem-fraction-static: 0.8)
    partial_rollout: Optional[Literal["resume", "redo"]] = None  # fully-async: requests a weight update interrupts
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    weight_sync_timeout_s: float = 300.0
    model_tag: str = "policy"  # openai: the served model's name ("policy": the server's first model)
    api_key: Optional[str] = None
    max_retries: int = 3  # an unreachable server: tries with exponential backoff; managed: restarts
    freeze_for_weight_sync: bool = only(True, "requests wait (or are aborted) while weights load")
    max_batch_size: int = 64  # embedded: completions per batch; a server: requests in flight
    allow_text_round_trip: bool = False  # openai: train on ids re-tokenized from text (no token ids returned)
    allow_unsynced_weights: bool = False  # openai: train although the server never loads the learner's weights


@dataclass
class TrainServiceConfig:
    """The optimizer and loss of a remote training service (the guide's train_service.config;
    its learning_rate is trainer.lr, so schedules apply)."""
    loss_fn: Optional[str] = None  # importance_sampling | ppo | cispo | cross_entropy; default by trainer.type
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8


@dataclass
class TrainService:
    """Where a remote_api_* trainer trains: a Tinker-compatible API (`streamrl serve-training`,
    or Tinker itself). The self-hosted learner has no train_service."""
    backend: Literal["none", "tinker"] = "none"
    url: Optional[str] = None
    base_model: Optional[str] = None  # the service's name for the model; default rollout_worker.model_path
    request_timeout_s: float = 600.0  # a step's requests; the client retries a lost connection within it
    config: TrainServiceConfig = field(default_factory=TrainServiceConfig)


@dataclass
class TinkerService:
    lora_rank: int = 32  # 0: full fine-tuning (served by `streamrl serve-training`)
    api_key: Optional[str] = None  # default: $TINKER_API_KEY


@dataclass
class Service:
    inference_service: InferenceService = field(default_factory=InferenceService)
    train_service: TrainService = field(default_factory=TrainService)
    tinker_service: TinkerService = field(default_factory=TinkerService)
