"""Rollout workers: the seed API.

    class MyWorker(BaseRolloutWorker):
        def rollout(self, task: dict) -> str | None:
            result = self._inference_client.completion(prompt, temperature=..., max_tokens=...)
            trajectory = Trajectory(tokens=result["prompt_tokens"] + result["response_tokens"],
                                    loss_mask=[0] * len(result["prompt_tokens"]) + [1] * len(result["response_tokens"]),
                                    reward=reward, is_val=task["is_val"], extra_fields={...})
            return self._put_trajectory(trajectory)   # "success" | "fail" | "re-rollout"

The worker never has to pass behaviour logprobs: the inference client records every
completion of the rollout, and `_put_trajectory` finds each completion's response
tokens in the trajectory and takes their logprobs from there. A trained token that no
completion sampled is refused ("fail"): the learner could not compute its ratio.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrl.producers.evaluator import BaseEvaluationTarget, Evaluator, run_evaluator
from streamrl.producers.inference import Completion, InferenceUnavailable, PromptTooLong
from streamrl.producers.inference_client import InferenceClient, behaviour_logprobs  # the seed API's names
from streamrl.runtime.chat_template import as_messages
from streamrl.runtime.config_reads import WorkerConfig
from streamrl.runtime.registry import Registry
from streamrl.schema.events import Evaluation, Task, Turn, pack_float32, pack_int32, pack_mask
from streamrl.schema.events import Trajectory as TrajectoryEvent

SUCCESS, FAIL, RE_ROLLOUT = "success", "fail", "re-rollout"


@dataclass
class Trajectory:
    """What a worker builds: the exact tokens, which of them train, and the reward."""

    tokens: list[int]
    loss_mask: list[int]
    reward: float = 0.0
    is_val: bool = False
    extra_fields: dict[str, Any] = field(default_factory=dict)
    logprobs: list[float] | None = None  # optional: recovered from the completions otherwise
    turns: list[dict[str, Any]] | None = None  # multi-turn segments: role, start, end, trained, reward, meta
    weight_version: int | None = None  # the oldest policy that sampled it; from the completions otherwise
    token_versions: list[int] | None = None  # per token (0 where not sampled); from the completions otherwise


# `rollout_worker.type`: BaseRolloutWorker subclasses, built by `make_worker` as
# `cls(config)`; a custom worker is named by `custom_rollout_worker_module_path` instead.
ROLLOUT_WORKERS: Registry[type] = Registry("rollout worker type", "rollout_worker.type")
register_rollout_worker = ROLLOUT_WORKERS.register


# What a worker is built with besides its config: set by `make_worker` around the
# constructor, so a subclass may keep the guide's `__init__(self, config)`.
_RUNTIME = threading.local()


@contextmanager
def worker_runtime(inference_client, evaluator, publish, worker_id: str = "worker"):
    _RUNTIME.parts = (inference_client, evaluator, publish, worker_id)
    try:
        yield
    finally:
        _RUNTIME.parts = None


def make_worker(cls: type, config: dict, inference_client, evaluator, publish, worker_id: str = "worker"):
    """`cls(config)`, as the guide constructs workers, with the runtime parts in place."""
    with worker_runtime(inference_client, evaluator, publish, worker_id):
        return cls(config)


class ActivityTracker:
    """`self._activity_tracker.experiment_logger_post(backend, data, step)`, as in the
    guide: the values join the metrics of the rollout being run (its Evaluation event, so
    the ledger has them per step: view `worker_metrics`). Numbers only."""

    def __init__(self, worker: BaseRolloutWorker):
        self._worker = worker

    def experiment_logger_post(self, backend: str = "ledger", data: dict | None = None, step: int | None = None):
        logged = getattr(self._worker._local, "logged", None)
        if logged is None:
            raise RuntimeError(
                "experiment_logger_post: call it while a rollout runs (from rollout() or "
                "what it calls); the values are recorded with that rollout's step"
            )
        for key, value in (data or {}).items():
            try:
                logged[str(key)] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"experiment_logger_post: {key!r} is {value!r}, not a number") from None
        if step is not None:
            logged["logged_step"] = float(step)


class BaseRolloutWorker:
    """Subclass and implement `rollout(task)`; publishing is done by `_put_trajectory`.

    Built as the guide builds it, `Worker(config)` (`make_worker` supplies the inference
    client, evaluator and publisher); the explicit form
    `Worker(config, inference_client, evaluator, publish, worker_id)` works too."""

    def __init__(
        self,
        config=None,
        inference_client: InferenceClient | None = None,
        evaluator: Evaluator | None = None,
        publish: Callable[[Any], None] | None = None,
        worker_id: str | None = None,
    ):
        parts: tuple[Any, ...] = getattr(_RUNTIME, "parts", None) or (None, None, None, "worker")
        # a plain dict gets attribute access (`self._config.temperature`) and records the
        # keys read (runtime/config_reads.py); an OmegaConf DictConfig (the guide's unit
        # tests) already has attribute access
        self._config = WorkerConfig(config or {}) if isinstance(config, dict) or config is None else config
        # given, or the run's (every worker a run builds gets all three)
        self._inference_client: InferenceClient = inference_client if inference_client is not None else parts[0]
        self.evaluator: Evaluator = evaluator if evaluator is not None else parts[1]
        self._publish: Callable[[Any], None] = publish if publish is not None else parts[2]
        self.worker_id = worker_id or parts[3]
        self.tokenizer = getattr(self._inference_client, "tokenizer", None)
        self.logger = logging.getLogger(f"streamrl.worker.{type(self).__name__}")
        self._activity_tracker = ActivityTracker(self)
        self._local = threading.local()

    # --- the seed API --------------------------------------------------------------------
    def rollout(self, task: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def format_task_query(self, data_item: dict[str, Any]) -> str | list[dict[str, Any]]:
        """The prompt of a task (default: its `prompt` field, text or chat messages; the
        inference client renders it with the model's chat template)."""
        return data_item.get("prompt", "")

    def get_train_loss_mask(self, trajectory_infos: list[dict[str, Any]]) -> list[bool]:
        """Which sampled tokens train, given one info per LLM call of the rollout
        (`prompt_tokens`, `response_tokens`, `response_message`, `prompt_messages`,
        `is_final`, ...). Return one value per call, one per response token (calls in
        order), or one per token of the whole trajectory. Default: every response trains."""
        return [True] * len(trajectory_infos)

    def current_task(self) -> dict[str, Any]:
        """The task being rolled out, as `rollout(task)` received it."""
        return task_dict(self._local.task)

    def _put_trajectory(self, trajectory: Trajectory | dict) -> str:
        task: Task = self._local.task
        if isinstance(trajectory, dict):  # the guide's dict form: tokens, loss_mask, reward, the rest extra
            trajectory = trajectory_from_dict(trajectory)
        if self._local.logged:
            extra = dict(trajectory.extra_fields)
            extra["metrics"] = {**self._local.logged, **(extra.get("metrics") or {})}
            trajectory = Trajectory(**{**trajectory.__dict__, "extra_fields": extra})
        if len(trajectory.loss_mask) != len(trajectory.tokens):
            self._local.error = f"loss_mask has {len(trajectory.loss_mask)} entries for {len(trajectory.tokens)} tokens"
            return FAIL
        if trajectory.logprobs is not None and len(trajectory.logprobs) != len(trajectory.tokens):
            self._local.error = f"logprobs has {len(trajectory.logprobs)} entries for {len(trajectory.tokens)} tokens"
            return FAIL
        if trajectory.token_versions is not None and len(trajectory.token_versions) != len(trajectory.tokens):
            self._local.error = f"token_versions has {len(trajectory.token_versions)} entries for {len(trajectory.tokens)} tokens"
            return FAIL
        completions = self._inference_client.recorded()
        logprobs, token_versions = trajectory.logprobs, trajectory.token_versions
        if logprobs is None:  # recovered from the completions of this rollout
            try:
                logprobs, found_versions = behaviour_logprobs(trajectory.tokens, trajectory.loss_mask, completions)
            except ValueError as exc:
                self._local.error = str(exc)
                return FAIL
            token_versions = token_versions if token_versions is not None else found_versions
        versions = {c.weight_version for c in completions}
        weight_version = (
            trajectory.weight_version if trajectory.weight_version is not None else (min(versions) if versions else 0)
        )
        if weight_version < task.min_weight_version:
            return RE_ROLLOUT  # generated by a policy older than this task allows
        self._local.put = build_events(task, trajectory, logprobs, weight_version, completions, self.worker_id, token_versions)
        return SUCCESS

    # --- driving tasks ---------------------------------------------------------------------
    def run_task(self, task: Task, max_retries: int = 2) -> tuple[TrajectoryEvent, Evaluation]:
        """Roll `task` out (re-rolling when asked), then publish its trajectory and
        evaluation. A task always ends in a trajectory: a failure is recorded with its
        error and reward 0, so its group can complete."""
        for tries_left in range(max_retries, -1, -1):
            if self._attempt(task, lambda: self.rollout(task_dict(task)), tries_left):
                break
        else:
            self._local.put = failed_events(task, self._local.error, self.worker_id)
        return self._publish_put()

    def run_tasks(
        self, tasks: list[Task], max_retries: int = 2, done: Callable[[Task], None] = lambda task: None
    ) -> list[tuple[Task, int]]:
        """Roll out, in this thread, the tasks this worker can sample as one batch, calling
        `done(task)` as each one's events are published; returns the others, each with the
        retries it has left, for `run_task` (a thread each). The base worker batches
        nothing: `rollout(task)` waits on its own completions."""
        return [(task, max_retries) for task in tasks]

    def _attempt(self, task: Task, rollout: Callable[[], str | None], tries_left: int) -> bool:
        """One try of `task`: True when it put a trajectory, else `_local.error` says why.
        Its completions are seeded by the task's id and `tries_left` (a retry samples anew)."""
        self._local.task, self._local.put, self._local.error = task, None, None
        self._local.logged = {}
        self._inference_client.begin(is_val=task.is_val, seed_key=seed_key(task, tries_left))
        try:
            status = rollout()
        except InferenceUnavailable:
            raise  # not this task's failure: the worker stops and the task is rolled out again
        except Exception as exc:
            status, self._local.error = FAIL, f"{type(exc).__name__}: {exc}"
        if status == SUCCESS and self._local.put is not None:
            return True
        self._local.error = self._local.error or f"rollout returned {status!r}"
        return False

    def _publish_put(self) -> tuple[TrajectoryEvent, Evaluation]:
        trajectory_event, evaluation = self._local.put
        if self._config.get("task_name"):  # the guide's label: on every rollout, to query by (extra_fields->>'task_name')
            trajectory_event.extra_fields.setdefault("task_name", self._config["task_name"])
        self._keep_trace(trajectory_event, evaluation)
        self._publish(trajectory_event)
        self._publish(evaluation)
        return trajectory_event, evaluation

    def _keep_trace(self, event: TrajectoryEvent, evaluation: Evaluation) -> None:
        """`save_trace` (default on): the rollout's trace (an agent's steps; otherwise its
        LLM calls) stays in the trajectory's extra_fields, in the ledger; `trace_path`
        also writes it as RUN/TRAJECTORY.json under that folder. Off: the trace is dropped."""
        if not self._config.get("save_trace", True):
            event.extra_fields.pop("trace", None)
            return
        if "trace" not in event.extra_fields and event.error is None:
            event.extra_fields["trace"] = [
                {
                    "type": "llm",
                    "prompt_tokens": len(c.prompt_token_ids),
                    "response_tokens": len(c.response_token_ids),
                    "response": c.response_text,
                    "finish_reason": c.finish_reason,
                    "weight_version": c.weight_version,
                }
                for c in self._inference_client.recorded()
            ]
        folder = self._config.get("trace_path")
        if folder:
            path = Path(folder) / event.run_id / f"{event.trajectory_id}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(
                    {
                        "trajectory_id": event.trajectory_id,
                        "group_id": event.group_id,
                        "step": event.step,
                        "reward": evaluation.reward,
                        "prompt": event.prompt_text,
                        "response": event.response_text,
                        "error": event.error,
                        "trace": event.extra_fields.get("trace", []),
                    },
                    default=str,
                    indent=1,
                )
            )


@register_rollout_worker("single_turn")
class SingleTurnWorker(BaseRolloutWorker):
    """The default worker: one completion of the formatted prompt, scored by the evaluator."""

    def rollout(self, task):
        query, prompt = self._query_and_prompt(task)
        return self._score(task, query, self._inference_client.completion(prompt))

    def run_tasks(
        self, tasks: list[Task], max_retries: int = 2, done: Callable[[Task], None] = lambda task: None
    ) -> list[tuple[Task, int]]:
        """One completion a task: all of them are submitted at once (one engine batch, no
        thread a task), then each is scored here as it finishes, and `done(task)` called
        once its events are published (a worker's room counts the rollouts not yet done).
        A task whose try failed goes back to `run_task` with a retry fewer (or is recorded
        as failed when it has none left). A subclass with its own `rollout`, or a server
        engine, takes the ordinary path."""
        if type(self).rollout is not SingleTurnWorker.rollout or not getattr(self._inference_client, "batches", False):
            return super().run_tasks(tasks, max_retries, done)
        left, ready = [], []
        for task in tasks:
            self._local.task, row = task, task_dict(task)  # current_task() works in format_task_query
            try:
                ready.append((task, row, *self._query_and_prompt(row)))
            except Exception:  # the ordinary path records why
                left.append((task, max_retries))
        completions = self._inference_client.submit_each(
            [(prompt, task.is_val, seed_key(task, max_retries)) for task, _, _, prompt in ready]
        )
        for index, completion in completions:
            task, row, query, _ = ready[index]

            def score(row=row, query=query, completion=completion):
                if isinstance(completion, BaseException):
                    raise completion
                return self._score(row, query, self._inference_client.record(completion))

            if self._attempt(task, score, max_retries):
                self._publish_put()
            elif max_retries > 0:
                left.append((task, max_retries - 1))
                continue
            else:
                self._local.put = failed_events(task, self._local.error, self.worker_id)
                self._publish_put()
            done(task)
        return left

    def _query_and_prompt(self, task: dict[str, Any]) -> tuple[str | list[dict[str, Any]], list[int]]:
        query = self.format_task_query(task)
        prompt = self._inference_client.tokenize(query)
        limit = self._inference_client.max_prompt_tokens
        if limit is not None and len(prompt) > limit:
            raise PromptTooLong(f"the prompt has {len(prompt)} tokens, more than max_prompt_length ({limit})")
        return query, prompt

    def _score(self, task: dict[str, Any], query: str | list[dict[str, Any]], result: dict[str, Any]) -> str:
        info = {
            "prompt_tokens": result["prompt_tokens"],
            "response_tokens": result["response_tokens"],
            "prompt_messages": as_messages(query),
            "response_message": {"role": "assistant", "content": result["response"]},
            "finish_reason": result["finish_reason"],
            "is_final": True,
            "start": len(result["prompt_tokens"]),
        }
        tokens = result["prompt_tokens"] + result["response_tokens"]
        mask = token_loss_mask(self.get_train_loss_mask([info]), [info], len(tokens))
        outcome = run_evaluator(self.evaluator, task.get("data", {}), BaseEvaluationTarget(result["response"]))
        return self._put_trajectory(
            Trajectory(
                tokens=tokens,
                loss_mask=mask,
                reward=outcome.result.reward,
                is_val=task.get("is_val", False),
                extra_fields={
                    "metrics": outcome.result.metrics,
                    "ground_truth": outcome.result.ground_truth,
                    "extra_info": outcome.result.extra_info,
                    "evaluator_error": outcome.error,
                    "response": result["response"],
                    "finish_reason": result["finish_reason"],
                },
            )
        )


register_rollout_worker("simple")(SingleTurnWorker)  # the guide's name for it


def token_loss_mask(mask: list, infos: list[dict[str, Any]], length: int) -> list[int]:
    """`get_train_loss_mask`'s answer as one 0/1 per token of the trajectory. `infos` are
    the rollout's LLM calls, each with its `response_tokens` and their `start` position;
    the answer may give one value per call (the guide's per-message form), one per
    response token (calls in order), or one per token of the whole trajectory."""
    mask = [int(bool(m)) for m in mask]
    if len(mask) == length and len(mask) != len(infos):
        return mask
    spans = [(info["start"], len(info["response_tokens"])) for info in infos]
    out = [0] * length
    if len(mask) == len(infos):
        for (start, size), value in zip(spans, mask):
            out[start : start + size] = [value] * size
        return out
    if len(mask) == sum(size for _, size in spans):
        cursor = 0
        for start, size in spans:
            out[start : start + size] = mask[cursor : cursor + size]
            cursor += size
        return out
    raise ValueError(
        f"get_train_loss_mask returned {len(mask)} values: expected one per LLM call ({len(infos)}), "
        f"one per response token ({sum(size for _, size in spans)}) or one per token ({length})"
    )


def trajectory_from_dict(values: dict[str, Any]) -> Trajectory:
    """The guide's dict trajectory: `tokens`, `loss_mask`, `reward` (and optionally
    `is_val`, `logprobs`); every other key is kept in `extra_fields`."""
    values = dict(values)
    missing = [key for key in ("tokens", "loss_mask") if key not in values]
    if missing:
        raise ValueError(f"the trajectory dict has no {' or '.join(missing)}")
    known = {
        key: values.pop(key)
        for key in ("tokens", "loss_mask", "reward", "is_val", "logprobs", "turns", "weight_version", "token_versions")
        if key in values
    }
    extra = values.pop("extra_fields", None) or {}
    known["loss_mask"] = [int(bool(m)) for m in known["loss_mask"]]
    return Trajectory(**known, extra_fields={**values, **extra})


def seed_key(task: Task, tries_left: int) -> str:
    """What seeds a try's completions with the run's seed: the task's id (its step, group
    and place in the group; the same in every run of the recipe) and the tries it has left."""
    return f"{task.task_id}/{tries_left}"


def task_dict(task: Task) -> dict[str, Any]:
    row = dict(task.data)
    # `run_id` is the group, as in the guide (its trainers group a prompt's rollouts by
    # it); the run itself is `streamrl_run_id`.
    row.update(
        task_id=task.task_id,
        group_id=task.group_id,
        run_id=task.group_id,
        streamrl_run_id=task.run_id,
        is_val=task.is_val,
        step=task.step,
        data=task.data,
        prompt=task.prompt if task.prompt else task.data.get("prompt", ""),
    )
    return row


def build_events(
    task: Task,
    trajectory: Trajectory,
    logprobs: list[float],
    weight_version: int,
    completions: list[Completion],
    worker_id: str,
    token_versions: list[int] | None = None,
) -> tuple[TrajectoryEvent, Evaluation]:
    """The rollout's events. Its identity (ids, group, step) and whether it is a
    validation rollout come from the task, whatever the worker's trajectory says: a
    worker that forgets to copy `is_val` must not turn validation prompts into training
    samples."""
    extra = dict(trajectory.extra_fields)
    # Per-token versions are kept only when the sampled tokens span more than one version.
    sampled_versions = {v for v, m in zip(token_versions or [], trajectory.loss_mask) if m}
    spans_versions = len(sampled_versions) > 1
    metrics = {k: float(v) for k, v in (extra.pop("metrics", None) or {}).items()}
    extra_info = extra.pop("extra_info", None) or {}
    prompt_length = next((i for i, m in enumerate(trajectory.loss_mask) if m), len(trajectory.tokens))
    event = TrajectoryEvent(
        run_id=task.run_id,
        trajectory_id=task.task_id,
        task_id=task.task_id,
        group_id=task.group_id,
        sample_index=task.sample_index,
        group_size=task.group_size,
        weight_version=weight_version,
        tokens=pack_int32(trajectory.tokens),
        loss_mask=pack_mask(trajectory.loss_mask),
        logprobs=pack_float32(logprobs),
        prompt_length=prompt_length,
        token_versions=pack_int32(token_versions or []) if spans_versions else b"",
        prompt_text=task.prompt if isinstance(task.prompt, str) else json.dumps(task.prompt, ensure_ascii=False),
        response_text=str(extra.get("response", "")),
        finish_reason=str(extra.pop("finish_reason", completions[-1].finish_reason if completions else "")),
        turns=[Turn(**turn) for turn in trajectory.turns or []],
        worker_id=worker_id,
        is_val=task.is_val,
        step=task.step,
        extra_fields=extra,
    )
    evaluation = Evaluation(
        run_id=task.run_id,
        trajectory_id=task.task_id,
        task_id=task.task_id,
        group_id=task.group_id,
        reward=float(trajectory.reward),
        metrics=metrics,
        ground_truth=extra.get("ground_truth"),
        extra_info=extra_info,
        evaluator="rollout",
        is_val=task.is_val,
        step=task.step,
        error=extra.get("evaluator_error"),
    )
    return event, evaluation


def failed_events(task: Task, error: str, worker_id: str) -> tuple[TrajectoryEvent, Evaluation]:
    event = TrajectoryEvent(
        run_id=task.run_id,
        trajectory_id=task.task_id,
        task_id=task.task_id,
        group_id=task.group_id,
        sample_index=task.sample_index,
        group_size=task.group_size,
        worker_id=worker_id,
        is_val=task.is_val,
        step=task.step,
        finish_reason="error",
        error=error,
    )
    evaluation = Evaluation(
        run_id=task.run_id,
        trajectory_id=task.task_id,
        task_id=task.task_id,
        group_id=task.group_id,
        reward=0.0,
        evaluator="rollout",
        is_val=task.is_val,
        step=task.step,
        error=error,
    )
    return event, evaluation
