"""The recipe's `service:` section: where rollouts are sampled (inference_service) and,
for remote_api_* trainers, where the model trains (train_service, tinker_service)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from streamrl.runtime.config_fields import knob, only
from streamrl.schema.topics import BROKER_WINDOWS


@dataclass
class InferenceService:
    """Where rollouts are sampled (`runtime/recipe.py` checks which keys each backend reads)."""

    backend: str = knob("embedded", "a registered inference backend")
    url: str | list[str] | None = knob(None, "external server(s); sglang without one: managed servers")
    num_servers: int = knob(1, "managed sglang servers per rollout worker", ge=1)
    server_args: dict[str, Any] = knob(help="managed sglang: launch flags (mem-fraction-static: 0.8)", factory=dict)
    partial_rollout: Literal["resume", "redo"] | None = knob(
        None, "fully-async: what happens to requests a weight update interrupts"
    )
    startup_timeout_s: float = knob(300.0, "managed servers: how long one may take to start", gt=0.0)
    request_timeout_s: float = knob(600.0, "one completion request at most", gt=0.0)
    weight_sync_timeout_s: float = knob(300.0, "loading a weight version on a server at most", gt=0.0)
    model_tag: str = knob("policy", "openai: the served model's name (policy: the server's first model)")
    api_key: str | None = knob(None, "the server's API key")
    max_retries: int = knob(3, "an unreachable server: tries with jittered exponential backoff; managed: restarts", ge=0)
    freeze_for_weight_sync: bool = only(True, "requests wait (or are aborted) while weights load")
    max_batch_size: int = knob(64, "embedded: completions per batch; a server: requests in flight", ge=1)
    allow_text_round_trip: bool = knob(False, "openai: train on ids re-tokenized from text (no token ids returned)")
    allow_unsynced_weights: bool = knob(False, "openai: train although the server never loads the learner's weights")


@dataclass
class TrainServiceConfig:
    """The optimizer and loss of a remote training service (the guide's train_service.config;
    its learning_rate is trainer.lr, so schedules apply)."""

    loss_fn: str | None = knob(None, "importance_sampling, ppo, cispo or cross_entropy; default by trainer.type")
    beta1: float = knob(0.9, "Adam's beta1", ge=0.0, lt=1.0)
    beta2: float = knob(0.95, "Adam's beta2", ge=0.0, lt=1.0)
    eps: float = knob(1e-8, "Adam's epsilon", gt=0.0)


@dataclass
class TrainService:
    """Where a remote_api_* trainer trains: a Tinker-compatible API (`streamrl serve-training`,
    or Tinker itself). The self-hosted learner has no train_service."""

    backend: Literal["none", "tinker"] = knob("none", "tinker: a Tinker-compatible API (remote_api_* trainers)")
    url: str | None = knob(None, "the service's base URL")
    base_model: str | None = knob(None, "the service's name for the model; default rollout_worker.model_path")
    request_timeout_s: float = knob(600.0, "a step's requests; the client retries a lost connection within it", gt=0.0)
    config: TrainServiceConfig = knob(help="the service's optimizer and loss", factory=TrainServiceConfig)


@dataclass
class TinkerService:
    lora_rank: int = knob(32, "LoRA rank; 0: full fine-tuning (served by streamrl serve-training)", ge=0)
    api_key: str | None = knob(None, "default: $TINKER_API_KEY")


WINDOWS_NEED_PLAIN_PROCESSOR = (
    "service.broker.window_steps: the faust processor (STREAMRL_PARTITION_ASSIGNMENT=group) reads fixed topics and "
    "cannot follow rotating windows; unset STREAMRL_PARTITION_ASSIGNMENT (`streamrl run` then gives its processes "
    "fixed shards) or set it to shard, or leave window_steps unset (an external Kafka bounds topics with "
    "retention_ms)"
)


# The shortest window `window_steps: auto` makes: each window costs its readers a few
# partitions more to fetch, and its topics a creation and a deletion (docs/operations.md).
AUTO_WINDOW_STEPS = 25


@dataclass
class Broker:
    """What the run leaves on the Kafka broker (runtime/topic_retention.py)."""

    retention: Literal["remove", "keep"] = knob(
        "remove",
        "remove: a finished run's topics leave the broker once the ledger holds every event; keep: "
        "they stay (Kafka-side replay); the embedded broker holds them in memory",
    )
    retention_ms: int | None = knob(
        None,
        "an external Kafka: the run's topics keep records this long "
        "(retention.ms, set when the run creates them; longer than a snapshot "
        "interval, or a restarted learner cannot re-read its samples); the "
        "embedded broker refuses it",
        ge=1,
    )
    retention_bytes: int | None = knob(
        None,
        "an external Kafka: each partition of the run's topics keeps at most "
        "this many bytes (retention.bytes, as retention_ms); the embedded broker "
        "refuses it",
        ge=1,
    )
    window_steps: int | Literal["auto"] | None = knob(
        "auto",
        "rotate the topics of tasks, rollouts, samples and steps every this "
        "many steps: a window's topics leave the broker once the ledger holds them "
        "and the learner's newest snapshot (trainer.save_freq, at most this) is past them; the broker holds at "
        f"most {BROKER_WINDOWS} of a run's windows (the task publisher waits for the ledger sink), so a "
        "long run's broker memory stops growing; auto: on the embedded broker with fixed "
        f"shards (what `streamrl run` gives) and retention remove, windows of max({AUTO_WINDOW_STEPS}, trainer.save_freq, "
        "staleness_threshold + 2; 2 x staleness_threshold + 2 with trajectory_pool.batch_groups first_complete) steps, "
        "else none; none: one topic per kind",
        ge=1,
    )
    memory_warning_share: float = knob(
        0.25, "the run says once when the embedded broker's memory passes this share of the machine's", gt=0.0, le=1.0
    )

    def resolved_windows(self) -> int | None:
        """`window_steps` as its run recorded it. `auto` is resolved when a run is created
        (`resolved_window_steps`), so a process reading a run's recipe never meets it."""
        if self.window_steps == "auto":
            raise ValueError("service.broker.window_steps: auto reached a run's process unresolved (create_run resolves it)")
        return self.window_steps


@dataclass
class Service:
    inference_service: InferenceService = knob(help="where rollouts are sampled", factory=InferenceService)
    train_service: TrainService = knob(help="where a remote trainer trains", factory=TrainService)
    tinker_service: TinkerService = knob(help="the training service's model options", factory=TinkerService)
    broker: Broker = knob(help="the run's topics on the Kafka broker", factory=Broker)


def resolved_window_steps(broker: Broker, save_freq: int, staleness: int, embedded: bool, assignment: str) -> int | None:
    """What `window_steps` a run is created with: `auto` becomes windows on the embedded
    broker (which holds every record in memory) when the run's processes have fixed
    shards (the faust processor cannot follow windows), and none elsewhere: an external
    Kafka expires records by retention_ms, and `retention: keep` keeps every record on
    the broker for a Kafka-side replay."""
    if broker.window_steps != "auto":
        return broker.window_steps
    if not embedded or assignment != "shard" or broker.retention == "keep" or broker.retention_ms or broker.retention_bytes:
        return None
    return max(AUTO_WINDOW_STEPS, save_freq, staleness + 2)


def with_resolved_windows(recipe, embedded: bool, assignment: str):
    """`recipe` as a run records it, `window_steps: auto` resolved (a copy; the recipe
    itself when there is nothing to resolve). `streamrl run` and `create_run` both take
    it, so the two agree on the windows."""
    broker = recipe.service.broker
    if broker.window_steps != "auto":
        return recipe
    resolved = copy.deepcopy(recipe)
    resolved.service.broker.window_steps = resolved_window_steps(
        broker, recipe.trainer.save_freq, runs_ahead(recipe), embedded, assignment
    )
    return resolved


def runs_ahead(recipe) -> int:
    """How many steps, less one, the newest task may be published ahead of the oldest
    group not yet trained: k (weight.staleness_threshold; 0 in sync mode), and 2k when
    trajectory_pool.batch_groups is first_complete (a group may then train up to k steps
    after the one it was published for)."""
    k = 0 if recipe.weight.sync_mode == "sync" else recipe.weight.staleness_threshold
    return 2 * k if recipe.trajectory_pool.batch_groups == "first_complete" else k


def window_problems(broker: Broker, staleness: int, save_freq: int) -> list[str]:
    """A window must be longer than how far the writers run ahead of the learner (at most
    `staleness` + 1 steps; `runs_ahead`), or a reader's hold (schema/topics.py HELD_WINDOWS) could miss
    a step not yet trained; and at least `save_freq` steps long: a window leaves the broker
    once a snapshot is past it, and the task publisher waits for room when the broker
    holds BROKER_WINDOWS (runtime/topic_admin.py), so a rarer snapshot would stop the run."""
    windows = broker.window_steps
    if not isinstance(windows, int):  # none, or auto: resolved to a valid size when the run is created
        return []
    if broker.retention_ms or broker.retention_bytes:
        return [
            "service.broker.window_steps: not with retention_ms or retention_bytes: a rotating run's windows "
            "leave the broker whole once nothing needs them, and an expiry would only reach its run-level "
            "topics; choose one"
        ]
    if windows < staleness + 2:
        return [
            f"service.broker.window_steps: {broker.window_steps} is too short: a window must hold more steps than "
            f"the rollouts run ahead of the learner ({staleness} + 1: weight.staleness_threshold, twice that with "
            f"trajectory_pool.batch_groups first_complete), so at least "
            f"{staleness + 2}"
        ]
    if windows < save_freq:
        return [
            f"service.broker.window_steps: {windows} is shorter than trainer.save_freq ({save_freq}): a window "
            "leaves the broker once a snapshot is past it, and the run waits when the broker holds "
            f"{BROKER_WINDOWS} of its windows, so it must snapshot at least once a window; set "
            f"window_steps to at least {save_freq}, or auto"
        ]
    return []
