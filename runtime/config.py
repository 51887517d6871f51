"""The typed recipe: one `Recipe` object, defaults defined once, passed whole to every
process.

Keys follow the NexRL user guide (project_name, experiment_name, data, rollout_worker,
trajectory_pool, trainer, algorithm, weight, validate, service, logger). Choices fixed by
the design are `Literal`s; choices that code can extend (advantage estimators, policy
losses, trainers, ...) are plain strings checked against their registries
(`runtime/registry.py`) once the components are imported. A key of the guide that
StreamRL does not implement beyond one value is declared with `only(...)`: it may be
written, with that value, and any other value is refused — never accepted and ignored.

`check_recipe_values(values)` lists every problem of a nested mapping (unknown keys
with a did-you-mean, wrong types, refused values, each with its key path);
`Recipe.from_dict(values)` builds the typed object; `recipe.to_dict()` gives the
mapping back (what the run's `created` event records).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional


from runtime.config_fields import only, path_field  # noqa: F401  (recipe plugins import them from here)
from runtime.logger_config import Logger
from runtime.service_config import Service


@dataclass
class Environment:
    setup_script: Optional[str] = path_field()
    env_script: Optional[str] = path_field()  # a shell file sourced before ${oc.env:...} resolve


@dataclass
class Data:
    type: Literal["jsonl", "parquet"] = "jsonl"
    data_files: list[str] = field(default_factory=list, metadata={"path": True})
    shuffle: bool = True
    seed: int = 42
    max_prompt_length: int = 512  # tasks whose prompt is longer (in tokens) fail as rollouts, counted
    prompt_key: str = "prompt"
    answer_key: str = "answer"  # the target text, for the cross-entropy trainer and warm-up
    batch_size: int = only(1, "a step's size is trajectory_pool.batch_size")
    num_workers: int = only(1, "the publisher reads the data in one process")
    max_rows: Optional[int] = None  # validation: use only the first N rows


@dataclass
class RolloutWorker:
    type: str = "single_turn"  # a registered rollout worker type
    custom_rollout_worker_module_path: Optional[str] = path_field()
    custom_rollout_worker_class_name: Optional[str] = None
    evaluator_module_path: Optional[str] = None  # "file.py:ClassName" or "builtin:NAME"
    evaluator_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the evaluator's constructor
    agent_config_path: Optional[str] = path_field()  # type: agent (producers/agent_worker.py)
    agent_workspace: Optional[str] = path_field()  # a folder put on sys.path: its modules import each other
    tokenizer: Optional[str] = only(None, "the tokenizer is the one saved with model_path")
    model_path: Optional[str] = None
    task_name: str = ""  # a label for the recipe's own code (self._config.task_name)
    max_prompt_length: int = 512
    max_response_length: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    rollout_repeat_n: int = 8
    num_workers: int = 1
    max_concurrent_tasks: int = 16
    max_retries: int = 2
    save_trace: bool = True  # keep each rollout's trace (agent steps / LLM calls) in the ledger
    trace_path: Optional[str] = None  # also write each trace as RUN/TRAJECTORY.json under this folder
    # A custom worker's own settings live in its section, as in the guide
    # (`self._config.use_few_shot`): its unknown keys are kept here, not refused.
    extra: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})

    def worker_config(self) -> dict[str, Any]:
        """The section as the seed API's workers see it (`self._config`): every key,
        the custom worker's own ones included."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**values, **self.extra}


@dataclass
class TrajectoryPool:
    type: str = only("default", "groups complete by group id in the stream processor")
    batch_size: int = 8  # groups (prompts) per training step
    group_size: Optional[int] = None  # must equal rollout_worker.rollout_repeat_n when set
    key_list: list[str] = only(["prompt"], "a group is the rollouts of one task's prompt")
    check_batch_ready_function: str = only("batch_size", "a step is ready when batch_size groups are accounted for")
    group_timeout_s: float = 120.0
    incomplete_group_policy: Literal["drop", "train_partial"] = "drop"


@dataclass
class KlControl:
    type: str = "fixed"  # a registered KL controller: fixed | adaptive
    kl_coef: float = 0.0
    target_kl: float = 6.0
    horizon: int = 10000


@dataclass
class Algorithm:
    # a registered advantage estimator: group scope (grpo, dr_grpo, rloo, reinforce) or batch
    # scope (reinforce_plus_plus, reinforce_plus_plus_baseline), or a recipe's own
    type: str = "grpo"
    batch_size: Optional[int] = None  # the guide's copy of trajectory_pool.batch_size; must equal it
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: Optional[float] = 3.0  # dual-clip cap for negative advantages; null turns it off
    loss_agg_mode: str = "token-mean"  # a registered loss aggregation
    # seq-mean-token-sum-norm's constant divisor (Dr. GRPO's generation budget); with that
    # mode, null means rollout_worker.max_response_length; with any other mode it must stay null
    loss_scale_factor: Optional[float] = None
    # the epsilon of GRPO's (r - mean) / (std + epsilon): 1e-6 as verl, 1e-4 as TRL (grpo only)
    grpo_std_epsilon: float = 1e-6
    # multi-turn episodes: "episode" (every assistant token gets the episode's advantage) or
    # "turn" (each assistant turn gets the advantage of the return from that turn on)
    credit_assignment: Literal["episode", "turn"] = "episode"
    filter_zero_variance: bool = True
    # the ratio's denominator: the sampler's behaviour logprobs (false), or the learner's
    # own logprobs recomputed before each step (true; one learner process)
    do_old_log_prob_compute: bool = False
    # a registered policy loss: none (PPO-clip against the behaviour logprobs), truncated_is,
    # decoupled_ppo, gspo; `off_policy_correction` is the same key's earlier name
    policy_loss: str = "none"
    truncated_is_cap: float = 2.0
    use_kl_in_reward: bool = False
    use_kl_loss: bool = False
    kl_estimator: str = "k3"  # a registered KL estimator
    custom_advantage_module_path: Optional[str] = path_field()  # a .py file that calls register_advantage
    kl_ctrl: KlControl = field(default_factory=KlControl)
    # a custom trainer's own parameters (`config.algorithm.get("my_param")`), kept with a custom trainer
    extra: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})


@dataclass
class Trainer:
    type: str = "grpo"  # a registered trainer: grpo | cross_entropy, or custom
    # the class: "file.py:Class", or the file and custom_trainer_class_name, as the guide writes it
    custom_trainer_module_path: Optional[str] = None
    custom_trainer_class_name: Optional[str] = None
    total_train_steps: int = 100
    total_epochs: Optional[int] = None  # stop after this many passes over the data, if sooner
    lr: float = 3e-4
    lr_schedule: str = "constant"  # a registered schedule: constant | linear | cosine
    min_lr_ratio: float = 0.0  # the rate at the last step, as a fraction of lr
    lr_warmup_steps: int = 0  # linear ramp from 0 at the start of RL
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 8192
    warmup_cross_entropy_steps: int = 0
    warmup_batch_size: int = 64
    warmup_lr: Optional[float] = None
    warmup_messages_key: Optional[str] = None  # rows hold multi-turn demonstrations under this key
    num_threads: int = 1  # torch threads of each learner process
    # Where and how the learner computes (learner/parallel.py):
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA when present
    dtype: Literal["float32", "bfloat16"] = "float32"  # bfloat16: bf16 compute, fp32 master weights and reduce
    gradient_checkpointing: bool = False
    # packed: several samples per micro-batch row, no padding (learner/packing.py); auto
    # packs when the model's attention is varlen (flash attention), where a packed row
    # costs what its samples cost; with dense-mask attention (sdpa, eager) a packed row
    # pays attention over its whole length, so many short samples run faster padded
    packing: Literal["auto", "packed", "padded"] = "auto"
    ref_model_offload: bool = False  # keep the KL reference model on the CPU
    nproc_per_node: int = 1  # learner processes per node (torchrun); more than one shards with FSDP2
    nnodes: int = 1
    checkpoint_path: str = "runs/${experiment_name}/checkpoints"
    # a checkpoint every step (exact resume); older ones removed but every save_freq-th (all: remove_previous_ckpt)
    save_freq: int = 10
    remove_previous_ckpt: bool = False
    seed: int = 0


@dataclass
class Weight:
    type: str = only("default", "weights travel as safetensors folders announced on the weights topic")
    sync_mode: Literal["sync", "batch-async", "fully-async"] = "sync"
    staleness_threshold: int = 1
    sync_every: int = only(1, "a weight version per step; the publisher paces by it")
    sync_weight_path: str = "runs/${experiment_name}/weights"


@dataclass
class ValidateEval:
    type: str = only("default", "validation is greedy accuracy from the recipe's evaluator")
    compute_interval: int = 10


@dataclass
class Validate:
    validate_before_train: bool = True
    temperature: float = 0.0  # 0 = greedy
    data: Data = field(default_factory=Data)
    eval: ValidateEval = field(default_factory=ValidateEval)


class ReplaySource(str, enum.Enum):
    """Where a replay reads the recorded payloads: the broker, falling back to the
    ledger for what it no longer holds (auto), or only one of them."""
    auto = "auto"
    kafka = "kafka"
    ledger = "ledger"


@dataclass
class Replay:
    """Written by `streamrl replay` into the new run's config: where its data came from."""
    parent_run: str = ""
    source: str = "auto"
    steps: Optional[str] = None
    where: Optional[str] = None
    recompute_advantages: Optional[str] = None
    rescore: Optional[str] = None
    rate: Optional[float] = None
    train_steps: int = 0
    groups: int = 0
    trajectories: int = 0
    left_out_groups: int = 0
    read_from: dict[str, int] = field(default_factory=dict)


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
    replay: Optional[Replay] = field(default=None, metadata={"internal": True})

    @classmethod
    def from_dict(cls, values: dict) -> "Recipe":
        """The typed recipe from a checked mapping; missing keys take their defaults."""
        return _build(cls, values)

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        for section in ("rollout_worker", "algorithm"):  # a custom component's own keys, in its section
            values[section].update(values[section].pop("extra"))
        if values["replay"] is None:
            del values["replay"]
        return values

    def total_train_steps(self, dataset_rows: int) -> int:
        """`trainer.total_train_steps`, or fewer when `trainer.total_epochs` passes over the
        data sooner (each step takes `trajectory_pool.batch_size` rows). The one place the
        publisher, the learner and `streamrl run` learn a run's length."""
        total = self.trainer.total_train_steps
        if self.trainer.total_epochs:
            total = min(total, math.ceil(self.trainer.total_epochs * dataset_rows / self.trajectory_pool.batch_size))
        return total


class ConfigError(ValueError):
    """A recorded config (a run's `created` event) that this version's schema cannot hold."""


def _build(schema: type, values: dict, prefix: str = ""):
    hints = typing.get_type_hints(schema)
    kwargs, extra = {}, {}
    names = {f.name for f in dataclasses.fields(schema)}
    for key, value in (values or {}).items():
        if key not in names:
            extra[key] = value
            continue
        tp = _scalar_type(hints[key])
        kwargs[key] = (_build(tp, value, f"{prefix}{key}.") if dataclasses.is_dataclass(tp) and isinstance(value, dict)
                       else value)
    if extra:
        if "extra" not in names:
            raise ConfigError("unknown keys " + ", ".join(f"{prefix}{key}" for key in sorted(extra)))
        kwargs["extra"] = {**kwargs.get("extra", {}), **extra}
    return schema(**kwargs)


# --- checking a mapping against the schema ------------------------------------------------

def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _scalar_type(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else None
    return tp


def _check_value(value, tp, key: str) -> list[str]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:  # Optional[X], Union[X, Y]: the value fits one of them
        if value is None and type(None) in args:
            return []
        found = [_check_value(value, a, key) for a in args if a is not type(None)]
        return [] if any(not problems for problems in found) else found[0]
    if tp is Any:
        return []
    if origin is Literal:
        return [] if value in args else [f"{key}: expected one of {', '.join(map(str, args))}, got {value!r}"]
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


def coerce_strings(values: dict, schema: type = Recipe) -> None:
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


def check_against(values: dict, schema: type = Recipe, prefix: str = "") -> list[str]:
    """Unknown keys (with the closest known one), wrong types and refused values."""
    problems = []
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key, value in values.items():
        spec = fields.get(key)
        if spec is None or spec.metadata.get("internal"):
            known = [name for name, f in fields.items() if not f.metadata.get("internal")]
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            problems.append(f"{prefix}{key}: unknown key{hint}")
            continue
        found = _check_value(value, hints[key], f"{prefix}{key}")
        problems += found
        if not found and "only" in spec.metadata:
            default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
            if value != default:
                problems.append(f"{prefix}{key}: only {default!r} is supported ({spec.metadata['only']}), got {value!r}")
    return problems


def missing_files(values: dict, schema: type, bases: list, prefix: str = "") -> list[str]:
    """Path keys naming nothing: a relative path is looked up in each of `bases` (the
    recipe's folder, then the working directory, where the guide's paths start)."""
    problems = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        value = values.get(f.name)
        tp = _scalar_type(hints[f.name])
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            problems += missing_files(value, tp, bases, f"{prefix}{f.name}.")
        elif f.metadata.get("path") and value:
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                where = f"{prefix}{f.name}" + (f"[{i}]" if isinstance(value, list) else "")
                if not any((base / str(item)).exists() for base in bases):
                    problems.append(f"{where}: file not found: {item} (relative to "
                                    f"{' or '.join(str(base) for base in bases)})")
    return problems
