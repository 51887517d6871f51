"""The event records: one typed, versioned msgspec Struct per topic.

Every event carries `run_id`, a deterministic `event_id`, `schema_version` and
`created_at`. The id is derived from the event's natural key (a task's id, a step
number, ...) so that publishing the same fact twice produces the same id, which is
what makes every consumer idempotent.

Token ids, masks and logprobs travel as packed little-endian bytes (int32, uint8,
float32): msgpack stores them as one binary blob instead of thousands of numbers,
which is what keeps a 4,096-token trajectory's encode+decode in the microseconds.
Use `pack_*` / `unpack_*` to go between numpy arrays and those bytes.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec
import numpy as np

# A fixed namespace: uuid5(namespace, key) is then a pure function of the key.
EVENT_ID_NAMESPACE = uuid.UUID("6f1c2a4e-8f0d-5b7e-9a3c-2d4e6f8a0b1c")


_NAMESPACE_BYTES = EVENT_ID_NAMESPACE.bytes


def make_event_id(kind: str, run_id: str, *key_parts: Any) -> str:
    """Deterministic id of the event of `kind` in `run_id` with this natural key:
    str(uuid.uuid5(EVENT_ID_NAMESPACE, key)), spelt out (SHA-1, version and variant bits)
    because building the UUID object costs more than the hash, twice a rollout."""
    key = "|".join([kind, run_id, *(str(p) for p in key_parts)])
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + key.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def pack_int32(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def unpack_int32(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i4")


def pack_float32(values: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_float32(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")


def pack_mask(values: Sequence[int] | Sequence[bool] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=np.uint8).tobytes()


def unpack_mask(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


class Event(msgspec.Struct, kw_only=True, tag_field="type", omit_defaults=True):
    """Fields every event has. Subclasses define `KIND` (the topic kind) and `natural_key`."""

    KIND: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1

    run_id: str
    event_id: str = ""
    schema_version: int = 0
    created_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.event_id:
            self.event_id = make_event_id(self.KIND, self.run_id, *self.natural_key())
        if not self.schema_version:
            self.schema_version = self.SCHEMA_VERSION
        if not self.created_at:
            self.created_at = time.time()

    def natural_key(self) -> tuple[Any, ...]:
        raise NotImplementedError


class Task(Event, tag="task", kw_only=True):
    """One rollout to perform: a prompt, repeated `group_size` times per group."""

    KIND: ClassVar[str] = "tasks"

    task_id: str
    group_id: str
    sample_index: int = 0
    group_size: int = 1
    prompt: str | list[dict[str, Any]] = ""
    data: dict[str, Any] = {}
    is_val: bool = False
    step: int = 0
    min_weight_version: int = 0

    def natural_key(self) -> tuple[Any, ...]:
        return (self.task_id,)


class Turn(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One segment of a multi-turn trajectory: tokens[start:end] spoken by `role`."""

    role: str  # "prompt" (system, few-shot, question) | "assistant" | "tool" | "user"
    start: int
    end: int
    trained: bool = False
    reward: float | None = None
    meta: dict[str, Any] = {}


class Trajectory(Event, tag="trajectory", kw_only=True):
    """A finished rollout: the exact tokens, which of them train, and behaviour logprobs."""

    KIND: ClassVar[str] = "trajectories"

    trajectory_id: str
    task_id: str
    group_id: str
    sample_index: int = 0
    group_size: int = 1
    weight_version: int = 0
    tokens: bytes = b""  # int32 LE
    loss_mask: bytes = b""  # uint8, one per token
    logprobs: bytes = b""  # float32 LE, one per token (0 where not sampled)
    # int32 LE, one per token: the weight version that sampled it, when the rollout spans
    # versions (a partial rollout resumed under new weights); empty: all `weight_version`
    token_versions: bytes = b""
    prompt_length: int = 0
    prompt_text: str = ""
    response_text: str = ""
    turns: list[Turn] = []
    finish_reason: str = ""
    timings: dict[str, float] = {}
    worker_id: str = ""
    is_val: bool = False
    step: int = 0
    extra_fields: dict[str, Any] = {}
    error: str | None = None
    source_event_id: str | None = None  # replayed runs: the event this one copies

    def natural_key(self) -> tuple[Any, ...]:
        return (self.trajectory_id,)


class Evaluation(Event, tag="evaluation", kw_only=True):
    KIND: ClassVar[str] = "evaluations"

    trajectory_id: str
    task_id: str = ""
    group_id: str
    reward: float
    metrics: dict[str, float] = {}
    ground_truth: Any = None
    extra_info: dict[str, Any] = {}
    evaluator: str = ""
    is_val: bool = False
    step: int = 0
    error: str | None = None
    source_event_id: str | None = None  # replayed runs: the evaluation this one copies (None when rescored)

    def natural_key(self) -> tuple[Any, ...]:
        return (self.trajectory_id, self.evaluator)


class Sample(Event, tag="sample", kw_only=True):
    """What the learner trains on: a trajectory with its advantage."""

    KIND: ClassVar[str] = "samples"

    trajectory_id: str
    group_id: str
    advantage: float = 0.0
    token_advantages: bytes = b""  # float32 LE per token, when the estimator is per-token
    reward: float = 0.0
    group_reward_mean: float = 0.0
    group_reward_std: float = 0.0
    group_size: int = 1
    estimator: str = ""
    weight_version: int = 0
    step: int = 0
    tokens: bytes = b""
    loss_mask: bytes = b""
    logprobs: bytes = b""
    token_versions: bytes = b""  # as Trajectory.token_versions

    def natural_key(self) -> tuple[Any, ...]:
        return (self.trajectory_id,)


class GroupFiltered(Event, tag="group_filtered", kw_only=True):
    """A group that produced no samples, and why: its rewards had no variance, or it
    never completed (timeout). Travels on the samples topic so the learner can tell that
    a step's groups are all accounted for; kept in the ledger so nothing vanishes."""

    KIND: ClassVar[str] = "samples"

    group_id: str
    # "zero_variance" | "timeout" | "all_failed"; or "late": trajectories of a group that
    # had closed without them (one record per arrival, not counted by the learner)
    reason: str
    step: int = 0
    group_size: int = 1
    received: int = 0
    rewards: list[float] = []
    trajectory_ids: list[str] = []

    def natural_key(self) -> tuple[Any, ...]:
        if self.reason == "late":
            return ("late", self.group_id, *self.trajectory_ids)
        return ("filtered", self.group_id)


class TrainStep(Event, tag="train_step", kw_only=True):
    KIND: ClassVar[str] = "steps"

    step: int
    weight_version: int = 0
    loss: float = 0.0
    kl: float | None = None
    entropy: float | None = None
    clip_fraction: float = 0.0
    grad_norm: float = 0.0
    lr: float = 0.0
    tokens: int = 0
    samples: int = 0
    sample_ids: list[str] = []  # trajectory ids trained in this step (lineage)
    # a batch-scope estimator's advantages, as trained, beside sample_ids (empty otherwise:
    # a group-scope estimator's are on the samples)
    trained_advantages: list[float] = []
    dropped_ids: list[str] = []  # trajectory ids dropped as too stale
    # the groups the step accounted for (trained, dropped or filtered): with
    # trajectory_pool.batch_groups first_complete, not those published for the step
    group_ids: list[str] = []
    staleness: dict[str, float] = {}  # mean / max / dropped
    seconds: float = 0.0
    consumed_offsets: dict[str, int] = {}  # "topic:partition" -> next offset
    metrics: dict[str, float] = {}

    def natural_key(self) -> tuple[Any, ...]:
        return (self.step,)


class WeightBroadcast(msgspec.Struct, kw_only=True):
    """Where and how a version's tensors are broadcast to the inference servers
    (`weight.transport: distributed`): the learner's rank 0 is rank 0 of a process group
    of its own for this version; the servers join it at ranks 1.. and receive the tensors
    in this order."""

    address: str
    port: int  # the learner's rendezvous store (TCPStore) for this version
    group_name: str
    world_size: int  # 1 + every server rank of every worker
    backend: str  # gloo (CPU) or nccl (CUDA)
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    # consecutive tensors sent as one flat byte buffer each (SGLang's flattened_bucket):
    # one collective per bucket instead of one per tensor
    bucket_sizes: list[int] = []


class WeightVersion(Event, tag="weight_version", kw_only=True):
    KIND: ClassVar[str] = "weights"

    version: int
    step: int = 0
    uri: str = ""  # a safetensors directory (with a broadcast: where it will be, once written)
    sha256: str = ""  # of the folder; empty when announced before it was written (broadcast)
    broadcast: WeightBroadcast | None = None

    def natural_key(self) -> tuple[Any, ...]:
        return (self.version,)


RUN_EVENT_KINDS = (
    "created",
    "started",
    "finished",
    "failed",
    "replayed_from",
    "resumed",
    "resume_checked",
    "config_unread",
    "snapshot",
)


class RunEvent(Event, tag="run_event", kw_only=True):
    """A run's lifecycle: created (with its resolved config), started, finished, ..."""

    KIND: ClassVar[str] = "runs"

    kind: str
    sequence: int = 0  # distinguishes repeated lifecycle events (e.g. several resumes)
    name: str = ""
    config: dict[str, Any] = {}
    parent_run_id: str | None = None
    message: str = ""
    details: dict[str, Any] = {}

    def __post_init__(self) -> None:
        if self.kind not in RUN_EVENT_KINDS:
            raise ValueError(f"RunEvent.kind must be one of {RUN_EVENT_KINDS}, got {self.kind!r}")
        super().__post_init__()

    def natural_key(self) -> tuple[Any, ...]:
        return (self.kind, self.sequence)


class DeadLetter(Event, tag="dead_letter", kw_only=True):
    """A message that could not be decoded or processed, kept with its coordinates."""

    KIND: ClassVar[str] = "dead_letters"

    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None = None
    raw: bytes = b""
    error: str = ""
    stage: str = ""  # which process gave up on it (e.g. "ledger-sink")

    def natural_key(self) -> tuple[Any, ...]:
        return (self.source_topic, self.source_partition, self.source_offset)


EVENT_TYPES: tuple[type[Event], ...] = (
    Task,
    Trajectory,
    Evaluation,
    Sample,
    TrainStep,
    WeightVersion,
    RunEvent,
    DeadLetter,
)
# The main record of each topic; a topic may also carry secondary records (below).
EVENT_BY_KIND: dict[str, type[Event]] = {cls.KIND: cls for cls in EVENT_TYPES}
SECONDARY_EVENT_TYPES: tuple[type[Event], ...] = (GroupFiltered,)
ALL_EVENT_TYPES = EVENT_TYPES + SECONDARY_EVENT_TYPES
