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
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from streamrl.runtime.config_fields import (  # noqa: F401  (missing_files: runtime.recipe reads it from here)
    _scalar_type,
    describe_range,
    knob,
    missing_files,
    only,
    out_of_range,
    path_field,
)
from streamrl.runtime.config_weights import Lora, Weight  # re-exported: runtime.config is where sections live
from streamrl.runtime.logger_config import Logger
from streamrl.runtime.service_config import Service


@dataclass
class Environment:
    setup_script: str | None = path_field(
        help="a Python file run in its folder before the recipe is read (makes data, a model), or the guide's .sh env file"
    )
    env_script: str | None = path_field(help="a shell file sourced before ${oc.env:...} resolve")


@dataclass
class Data:
    type: Literal["auto", "jsonl", "parquet", "hf"] = knob(
        "auto",
        "the data files' format (hf: folders written by datasets' save_to_disk); auto: by the files' "
        "extension (.jsonl, .parquet) or a folder, all of one type",
    )
    data_files: list[str] = knob(help="the rows, relative to the recipe's folder", factory=list, path=True)
    shuffle: bool = knob(True, "shuffle the rows (each epoch, with seed)")
    seed: int = knob(42, "the shuffle's seed")
    max_prompt_length: int = knob(
        512,
        "a longer prompt (in tokens) fails its rollout, recorded with the numbers "
        "(the smaller of this and rollout_worker.max_prompt_length applies)",
        ge=1,
    )
    prompt_key: str = knob(
        "prompt", "the column holding the prompt: a string or a list of chat messages (a dotted path reaches into nested columns)"
    )
    answer_key: str = knob(
        "answer",
        "the column holding the target text, a dotted path allowed "
        "(reward_model.ground_truth): the built-in evaluators', the cross-entropy "
        "trainer's and the warm-up's",
    )
    apply_chat_template: bool | Literal["auto"] = knob(
        "auto",
        "render prompts with the model's chat template: auto (when the tokenizer has one), true, or false "
        "(raw text, for pretrained-only models)",
    )
    chat_template: str | None = knob(
        None,
        "a Jinja chat template instead of the tokenizer's (a .jinja file or its text); the run records the template it used here",
    )
    filter_overlong_prompts: bool = knob(
        False,
        "leave out the training rows whose prompt is longer than max_prompt_length (verl's key): counted at "
        "validate and run, recorded in the run's config; off: such rows are refused at validate",
    )
    # the rows filter_overlong_prompts leaves out (0-based), computed by prepare_recipe
    # and recorded with the run, so that every process leaves out the same rows
    skip_rows: list[int] = knob(help="training rows left out", factory=list, internal=True)
    chat_template_kwargs: dict[str, Any] = knob(
        help="extra values the chat template reads (verl's apply_chat_template_kwargs), e.g. {enable_thinking: false}",
        factory=dict,
    )
    template_date: str | None = knob(
        None,
        "the date (YYYY-MM-DD) a template that reads one renders (Llama 3.x's system header: strftime_now, "
        "date_string); unset: the day the run is prepared, recorded with the run so every process and a "
        "replay render the same prompt",
    )
    batch_size: int = only(1, "a step's size is trajectory_pool.batch_size")
    num_workers: int = only(1, "the publisher reads the data in one process")
    max_rows: int | None = knob(None, "use only the first N rows (validation sets)", ge=1)


@dataclass
class RolloutWorker:
    type: str = knob("single_turn", "a registered rollout worker type")
    custom_rollout_worker_module_path: str | None = path_field(
        help="the file of a custom worker class (file.py, or file.py:Class)"
    )
    custom_rollout_worker_class_name: str | None = knob(
        None, "the custom worker's class, when the module path names only the file (the guide's form)"
    )
    evaluator_module_path: str | None = knob(None, "the evaluator: file.py:ClassName or builtin:NAME")
    evaluator_kwargs: dict[str, Any] = knob(help="passed to the evaluator's constructor", factory=dict)
    agent_config_path: str | None = path_field(
        help="type agent: the agent's YAML (tools, limits, interaction; producers/agent_worker.py)"
    )
    agent_workspace: str | None = path_field(help="a folder put on sys.path: its modules import each other")
    agent_loop_config_path: str | None = path_field(
        help="type agent: verl's agent-loop registry, a YAML list of {name, _target_: module.Class, ...args} "
        "(AgentLoop or ToolAgentLoop subclasses); a row's agent_name picks one"
    )
    default_agent_loop: str | None = knob(
        None, "type agent: the registered loop a row without agent_name runs (unset: StreamRL's own loop)"
    )
    tool_config_path: str | None = path_field(
        help="type agent: verl's tool config, `tools: [{class_name, config, tool_schema}]` (BaseTool classes), added "
        "to the agent config's tools; a row's tools_kwargs reach them"
    )
    interaction_config_path: str | None = path_field(
        help="type agent: verl's interaction config, `interaction: [{name, class_name, config}]` (BaseInteraction "
        "classes); a row's interaction_kwargs start one and pick it by name"
    )
    max_assistant_turns: int | None = knob(
        None, "type agent: the agent config's limits.max_assistant_turns, set here (verl's multi_turn key)", ge=1
    )
    max_user_turns: int | None = knob(
        None, "type agent: the agent config's limits.max_user_turns, set here (verl's multi_turn key)", ge=0
    )
    tokenizer: str | None = only(None, "the tokenizer is the one saved with model_path")
    model_path: str | None = knob(None, "the policy: a Hugging Face model folder with its tokenizer")
    task_name: str = knob(
        "", "a label: the recipe's own code reads it (self._config.task_name), and every rollout records it (extra_fields)"
    )
    max_prompt_length: int = knob(512, "a longer prompt (in tokens) fails its rollout, recorded with the numbers", ge=1)
    max_response_length: int = knob(64, "tokens sampled per response at most", ge=1)
    temperature: float = knob(1.0, "sampling temperature of training rollouts", ge=0.0)
    top_p: float = knob(1.0, "nucleus sampling of training rollouts", gt=0.0, le=1.0)
    rollout_repeat_n: int = knob(8, "samples per prompt: the group size", ge=1)
    num_workers: int = knob(1, "rollout worker processes `streamrl run` starts", ge=1)
    max_concurrent_tasks: int = knob(16, "rollouts a worker has in flight (fully-async: not yet done)", ge=1)
    num_threads: int | None = knob(
        None,
        "torch threads of each worker process (the embedded engine samples "
        "with them); unset: as trainer.num_threads (runtime/threads.py)",
        ge=1,
    )
    max_retries: int = knob(2, "tries a failed rollout gets again before it is recorded as failed", ge=0)
    save_trace: bool = knob(True, "keep each rollout's trace (agent steps, LLM calls) in the ledger")
    trace_path: str | None = knob(None, "also write each trace as RUN/TRAJECTORY.json under this folder (needs save_trace)")
    # A custom worker's own settings live in its section, as in the guide
    # (`self._config.use_few_shot`): its unknown keys are kept here, not refused.
    extra: dict[str, Any] = knob(help="a custom worker's own keys", factory=dict, internal=True)

    def worker_config(self) -> dict[str, Any]:
        """The section as the seed API's workers see it (`self._config`): every key,
        the custom worker's own ones included."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**values, **self.extra}

    def model_folder(self) -> str:
        """model_path, which a run that loads the policy names (recipe validation checks it)."""
        if self.model_path is None:
            raise ConfigError("rollout_worker.model_path: no model folder given")
        return self.model_path


@dataclass
class TrajectoryPool:
    type: str = only("default", "groups complete by group id in the stream processor")
    batch_size: int = knob(8, "groups (prompts) per training step", ge=1)
    group_size: int | None = knob(None, "samples per group; must equal rollout_worker.rollout_repeat_n when set", ge=1)
    key_list: list[str] = only(["prompt"], "a group is the rollouts of one task's prompt")
    check_batch_ready_function: str = only("batch_size", "a step is ready when batch_size groups are accounted for")
    group_timeout_s: float = knob(120.0, "a group not complete after this long is closed by incomplete_group_policy", gt=0.0)
    incomplete_group_policy: Literal["drop", "train_partial"] = knob(
        "drop", "a timed-out group: recorded and not trained (drop), or trained on what arrived (train_partial)"
    )
    batch_groups: Literal["published", "first_complete"] = knob(
        "published",
        "which groups a step trains: those published for it (a step waits for its slowest group), or the first "
        "batch_size groups to complete, whatever step they were published for (a slow group trains in a later "
        "step; the staleness bound then counts from the step a group was published for)",
    )


@dataclass
class KlControl:
    type: str = knob("fixed", "a registered KL controller")
    kl_coef: float = knob(0.0, "the KL coefficient (the adaptive controller's start)", ge=0.0)
    target_kl: float = knob(6.0, "adaptive: the KL the coefficient steers to", gt=0.0)
    horizon: int = knob(10000, "adaptive: steps over which the coefficient adapts", ge=1)


@dataclass
class Algorithm:
    type: str = knob(
        "grpo",
        "a registered advantage estimator, of group scope (the stream processor computes it per "
        "group) or batch scope (the learner, over a step); a recipe's own too",
    )
    batch_size: int | None = knob(None, "the guide's copy of trajectory_pool.batch_size; must equal it", ge=1)
    clip_ratio_low: float = knob(0.2, "PPO clip below 1: the ratio is clipped at 1 - clip_ratio_low", ge=0.0, lt=1.0)
    clip_ratio_high: float = knob(0.28, "PPO clip above 1 (DAPO's clip-higher): 1 + clip_ratio_high", ge=0.0)
    clip_ratio_c: float | None = knob(3.0, "dual-clip cap for negative advantages; null turns it off", gt=1.0)
    loss_agg_mode: str = knob("token-mean", "a registered loss aggregation")
    loss_scale_factor: float | None = knob(
        None,
        "seq-mean-token-sum-norm's constant divisor (Dr. GRPO's generation budget); null with that mode: "
        "rollout_worker.max_response_length; must stay null with any other mode",
        gt=0.0,
    )
    grpo_std_epsilon: float = knob(
        1e-6, "the epsilon of GRPO's (r - mean) / (std + epsilon): 1e-6 as verl, 1e-4 as TRL (grpo only)", gt=0.0, le=1.0
    )
    credit_assignment: Literal["episode", "turn"] = knob(
        "episode",
        "multi-turn episodes: every assistant token gets the episode's advantage (episode), or each "
        "assistant turn the advantage of the return from that turn on (turn)",
    )
    filter_zero_variance: bool = knob(True, "a group whose rewards are all equal is recorded and not trained")
    do_old_log_prob_compute: bool = knob(
        False,
        "the ratio's denominator: the sampler's behaviour logprobs (false), or the learner's own logprobs "
        "recomputed before each step (true; one learner process)",
    )
    policy_loss: str = knob(
        "none",
        "a registered policy loss (none: PPO-clip against the behaviour logprobs); off_policy_correction is its earlier name",
    )
    truncated_is_cap: float = knob(2.0, "truncated_is: the cap of the importance weights", gt=0.0)
    use_kl_in_reward: bool = knob(False, "subtract the KL to the reference model from the rewards")
    use_kl_loss: bool = knob(False, "add the KL to the reference model to the loss")
    kl_estimator: str = knob("k3", "a registered KL estimator")
    custom_advantage_module_path: str | None = path_field(help="a .py file that registers advantage estimators")
    kl_ctrl: KlControl = knob(help="the KL coefficient and its controller", factory=KlControl)
    # a custom trainer's own parameters (`config.algorithm.get("my_param")`), kept with a custom trainer
    extra: dict[str, Any] = knob(help="a custom trainer's own keys", factory=dict, internal=True)


@dataclass
class Trainer:
    type: str = knob("grpo", "a registered trainer, or custom (the class custom_trainer_module_path names)")
    custom_trainer_module_path: str | None = knob(
        None, "a custom trainer's class: file.py:Class, or the file with custom_trainer_class_name"
    )
    custom_trainer_class_name: str | None = knob(None, "the custom trainer's class (the guide's form)")
    total_train_steps: int = knob(100, "GRPO steps in the run", ge=1)
    total_epochs: int | None = knob(None, "stop after this many passes over the data, if sooner", ge=1)
    lr: float = knob(
        1e-6,
        "AdamW's learning rate: verl's default, for a pretrained model (the tiny built-in recipes set their "
        "own); a run that fine-tunes a model `streamrl model init` did not make above 1e-4 warns",
        gt=0.0,
    )
    lr_schedule: str = knob("constant", "a registered learning-rate schedule")
    min_lr_ratio: float = knob(0.0, "the rate at the last step, as a fraction of lr", ge=0.0, le=1.0)
    lr_warmup_steps: int = knob(0, "a linear ramp from 0 over the first steps of RL", ge=0)
    weight_decay: float = knob(0.0, "AdamW's weight decay", ge=0.0)
    grad_clip: float = knob(1.0, "the gradient norm is clipped to this; 0 turns it off", ge=0.0)
    micro_batch_tokens: int = knob(
        8192,
        "padded tokens per micro-batch (bounds a forward pass's memory); a remote trainer: tokens per forward_backward request",
        ge=1,
    )
    warmup_cross_entropy_steps: int = knob(0, "supervised steps on the data's answers before GRPO", ge=0)
    warmup_until_accuracy: float | None = knob(
        None,
        "end the warm-up once greedy held-out accuracy reaches this, checked every warmup_check_every "
        "steps (warmup_cross_entropy_steps at most): where a fixed count lands differs between machines",
        gt=0.0,
        le=1.0,
    )
    warmup_check_every: int = knob(10, "warm-up steps between held-out checks (with warmup_until_accuracy)", ge=1)
    warmup_batch_size: int = knob(64, "rows per warm-up step", ge=1)
    warmup_lr: float | None = knob(None, "the warm-up's learning rate (default: lr)", gt=0.0)
    warmup_messages_key: str | None = knob(None, "rows hold multi-turn demonstrations under this key")
    num_threads: int | None = knob(
        None,
        "torch threads of each learner process; unset: every core in sync "
        "mode (the learner and workers take turns), a share of them in the "
        "asynchronous modes (runtime/threads.py)",
        ge=1,
    )
    device: Literal["auto", "cpu", "cuda"] = knob("auto", "where the learner computes (auto: CUDA when present)")
    dtype: Literal["auto", "float32", "bfloat16"] = knob(
        "auto",
        "bfloat16: bf16 compute, fp32 master weights and reduce; auto: bfloat16 on a CUDA device that supports it, else float32",
    )
    gradient_checkpointing: bool = knob(False, "recompute activations in the backward pass (less memory)")
    # auto packs when the model's attention is varlen (flash attention), where a packed row
    # costs what its samples cost; with dense-mask attention (sdpa, eager) a packed row
    # pays attention over its whole length, so many short samples run faster padded
    packing: Literal["auto", "packed", "padded"] = knob(
        "auto",
        "several samples per micro-batch row without padding (packed), one per row (padded), or by the model's attention (auto)",
    )
    # auto: each distinct prompt of a micro-batch runs once and its rollouts share its
    # KV cache (learner/shared_prefix.py); checked against the plain forward first
    shared_prefix: Literal["auto", "on", "off"] = knob(
        "auto",
        "run a group's shared prompt once per micro-batch (auto: with one learner process, padded rows "
        "and no gradient checkpointing)",
    )
    ref_model_offload: bool = knob(False, "keep the KL reference model on the CPU")
    nproc_per_node: int = knob(1, "learner processes per node (torchrun); more than one shard with FSDP2", ge=1)
    nnodes: int = knob(
        1, "learner nodes: `streamrl learner RUN --rdzv-endpoint HOST:PORT --local-addr ADDR` on each (docs/operations.md)", ge=1
    )
    checkpoint_path: str = knob(
        "runs/${experiment_name}/checkpoints", "where checkpoints go (relative: under STREAMRL_HOME), a folder per run"
    )
    save_freq: int = knob(
        10,
        "a snapshot (model, optimizer, offsets) every save_freq steps, at the last step and "
        "on stop; a restart re-trains the recorded steps after it (exact resume)",
        ge=1,
    )
    remove_previous_ckpt: bool = knob(False, "keep only the newest snapshot (else every one stays)")
    seed: int = knob(0, "the learner's seed")
    lora: Lora | None = knob(
        None,
        "train a LoRA adapter (peft) instead of every weight; weight versions are the "
        "merged model, and the KL reference is the base model (the adapter off)",
    )


@dataclass
class ValidateEval:
    type: str = only("default", "validation is greedy accuracy from the recipe's evaluator")
    compute_interval: int = knob(10, "validate every N weight versions", ge=1)


@dataclass
class Validate:
    validate_before_train: bool = knob(True, "validate the starting weights (version 0)")
    temperature: float = knob(0.0, "validation's sampling temperature (0: greedy)", ge=0.0)
    data: Data = knob(help="the held-out rows (in file order)", factory=lambda: Data(shuffle=False))
    eval: ValidateEval = knob(help="how often", factory=ValidateEval)


@dataclass
class FailureBudget:
    """How many failed rollouts (the rollout or its evaluator raised) a run tolerates
    before `streamrl run` stops it and exits non-zero (streamrl/failures.py)."""

    max_failed_share: float = knob(
        0.5, "a step, or a validation, with more than this share of its rollouts failed ends the run", ge=0.0, le=1.0
    )
    warn_share: float = knob(0.1, "a step with more than this share failed counts towards max_steps_over_warn", ge=0.0, le=1.0)
    max_steps_over_warn: int = knob(5, "this many steps in a row over warn_share end the run; 0: no such limit", ge=0)


class ReplaySource(enum.StrEnum):
    """Where a replay reads the recorded payloads: the broker, falling back to the
    ledger for what it no longer holds (auto), or only one of them."""

    auto = "auto"
    kafka = "kafka"
    ledger = "ledger"


@dataclass
class Replay:
    """Written by `streamrl replay` into the new run's config: where its data came from."""

    parent_run: str = knob("", "the run whose rollouts this one trains on")
    source: str = knob("auto", "where the payloads were read: auto, kafka, ledger")
    steps: str | None = knob(None, "the source's steps replayed (--steps)")
    where: str | None = knob(None, "the SQL condition that chose the rollouts (--where)")
    recompute_advantages: str | None = knob(None, "the estimator the new run computes advantages with")
    rescore: str | None = knob(None, "the evaluator the rollouts were scored again with")
    rate: float | None = knob(None, "rollouts a second the replay published at most", gt=0.0)
    train_steps: int = knob(0, "steps the replay trains", ge=0)
    groups: int = knob(0, "groups replayed", ge=0)
    trajectories: int = knob(0, "rollouts replayed", ge=0)
    left_out_groups: int = knob(0, "groups of a partial step left out", ge=0)
    read_from: dict[str, int] = knob(help="rollouts read from each source", factory=dict)


@dataclass
class Recipe:
    project_name: str = knob("streamrl", "the project (trackers group runs by it)")
    experiment_name: str = knob("experiment", "the experiment; run ids start with it")
    environment: Environment = knob(help="scripts that prepare the recipe", factory=Environment)
    data: Data = knob(help="the training rows", factory=Data)
    rollout_worker: RolloutWorker = knob(help="how rollouts are made and scored", factory=RolloutWorker)
    trajectory_pool: TrajectoryPool = knob(help="how rollouts become groups and steps", factory=TrajectoryPool)
    algorithm: Algorithm = knob(help="advantages, the policy loss, KL", factory=Algorithm)
    trainer: Trainer = knob(help="the learner", factory=Trainer)
    weight: Weight = knob(help="weight versions and staleness", factory=Weight)
    validate: Validate = knob(help="held-out validation", factory=Validate)
    failure_budget: FailureBudget = knob(help="failed rollouts a run tolerates", factory=FailureBudget)
    service: Service = knob(help="inference and training services", factory=Service)
    logger: Logger = knob(help="experiment trackers", factory=Logger)
    replay: Replay | None = knob(None, "written by streamrl replay", internal=True)

    @classmethod
    def from_dict(cls, values: dict) -> Recipe:
        """The typed recipe from a checked mapping; missing keys take their defaults."""
        return _build(cls, values)

    @classmethod
    def recorded(cls, values: dict) -> Recipe:
        """The recipe a run recorded in its `created` event. A run resolves
        `window_steps: auto` when it is created, so a recorded `auto` is a run recorded
        before the key had that default: it rotated nothing."""
        recipe = cls.from_dict(values)
        if recipe.service.broker.window_steps == "auto":
            recipe.service.broker.window_steps = None
        return recipe

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        for section in ("rollout_worker", "algorithm"):  # a custom component's own keys, in its section
            values[section].update(values[section].pop("extra"))
        if values["replay"] is None:
            del values["replay"]
        for data in (values["data"], values["validate"]["data"]):  # recorded only where rows were left out
            if not data["skip_rows"]:
                del data["skip_rows"]
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
        kwargs[key] = (
            _build(tp, value, f"{prefix}{key}.")
            if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict)
            else value
        )
    if extra:
        if "extra" not in names:
            raise ConfigError("unknown keys " + ", ".join(f"{prefix}{key}" for key in sorted(extra)))
        kwargs["extra"] = {**kwargs.get("extra", {}), **extra}
    return schema(**kwargs)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _check_value(value, tp, key: str) -> list[str]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X], Union[X, Y]: the value fits one of them
        if value is None and type(None) in args:
            return []
        found = [_check_value(value, a, key) for a in args if a is not type(None)]
        return [] if any(not problems for problems in found) else found[0]
    if tp is Any:
        return []
    if origin is Literal:
        return [] if value in args else [f"{key}: expected one of {', '.join(map(str, args))}, got {value!r}"]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
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
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
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
        bounds = spec.metadata.get("range")
        if (
            not found
            and bounds
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and out_of_range(value, bounds)
        ):
            found = [f"{prefix}{key}: must be {describe_range(bounds)}, got {value!r}"]
        problems += found
        if not found and "only" in spec.metadata:
            factory = spec.default_factory
            default = spec.default if spec.default is not dataclasses.MISSING else factory() if callable(factory) else None
            if value != default:
                problems.append(f"{prefix}{key}: only {default!r} is supported ({spec.metadata['only']}), got {value!r}")
    return problems
