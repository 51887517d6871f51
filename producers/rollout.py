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

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from producers.evaluator import BaseEvaluationTarget, Evaluator, run_evaluator
from producers.inference import Completion, InferenceUnavailable, SamplingParams
from schema.events import Evaluation, Task, Turn, pack_float32, pack_int32, pack_mask
from schema.events import Trajectory as TrajectoryEvent
from runtime.registry import Registry

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


class InferenceClient:
    """`completion(prompt)` for workers; records the completions of the current rollout.

    `engine` is an engine front (`tokenizer`, `complete(prompt_ids, params)`): the
    embedded BatchingEngine, or an inference server's (SGLang, OpenAI-compatible)."""

    def __init__(self, engine, defaults: SamplingParams, val_defaults: SamplingParams | None = None,
                 max_prompt_tokens: int | None = None):
        self._engine = engine
        self.max_prompt_tokens = max_prompt_tokens  # a task's prompt may not be longer (in tokens)
        self._train_defaults = defaults
        self._val_defaults = val_defaults or defaults
        self._local = threading.local()
        # A group's rollouts share their prompt, so most prompts are tokenised again
        # and again; the tokenizer's call costs more than a small model's sampling step.
        self._prompt_ids = functools.lru_cache(maxsize=4096)(
            lambda prompt: tuple(self.tokenizer(prompt)["input_ids"]))

    @property
    def _defaults(self) -> SamplingParams:
        # Validation rollouts sample with the validation settings (greedy by default).
        return self._val_defaults if getattr(self._local, "is_val", False) else self._train_defaults

    @property
    def tokenizer(self):
        return self._engine.tokenizer

    def tokenize(self, prompt: str) -> list[int]:
        return list(self._prompt_ids(prompt))

    def begin(self, is_val: bool = False) -> None:
        self._local.completions = []
        self._local.is_val = is_val

    def recorded(self) -> list[Completion]:
        return list(getattr(self._local, "completions", []))

    def completion(self, prompt: str | list[int], temperature: float | None = None,
                   max_tokens: int | None = None, top_p: float | None = None,
                   stop_token_ids: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        params = SamplingParams(
            max_new_tokens=max_tokens if max_tokens is not None else self._defaults.max_new_tokens,
            temperature=temperature if temperature is not None else self._defaults.temperature,
            top_p=top_p if top_p is not None else self._defaults.top_p, stop_token_ids=tuple(stop_token_ids))
        result: Completion = self._engine.complete(prompt_ids, params)
        if hasattr(self._local, "completions"):
            self._local.completions.append(result)
        return {"prompt_tokens": result.prompt_token_ids, "response_tokens": result.response_token_ids,
                "response": result.response_text, "logprobs": result.logprobs,
                "finish_reason": result.finish_reason, "weight_version": result.weight_version,
                "token_versions": result.token_versions or [result.weight_version] * len(result.response_token_ids)}


def behaviour_logprobs(tokens: list[int], loss_mask: list[int], completions: list[Completion]
                       ) -> tuple[list[float], list[int]]:
    """Per-token behaviour logprobs and the weight version that sampled each token: each
    completion's response is found in `tokens` (in order, searching forward); tokens no
    completion sampled get 0 and version 0. Raises ValueError if a trained token was not
    sampled by any completion."""
    logprobs = [0.0] * len(tokens)
    versions = [0] * len(tokens)
    sampled = [False] * len(tokens)
    cursor = 0
    for completion in completions:
        response = completion.response_token_ids
        if not response:
            continue
        for start in range(cursor, len(tokens) - len(response) + 1):
            if tokens[start:start + len(response)] == response:
                logprobs[start:start + len(response)] = completion.logprobs
                versions[start:start + len(response)] = (completion.token_versions or
                                                         [completion.weight_version] * len(response))
                sampled[start:start + len(response)] = [True] * len(response)
                cursor = start + len(response)
                break
    unsampled = [i for i, (m, s) in enumerate(zip(loss_mask, sampled)) if m and not s]
    if unsampled:
        raise ValueError(f"{len(unsampled)} trained token(s) (first at position {unsampled[0]}) were not "
                         "sampled by any completion of this rollout: no behaviour logprob to train with")
    return logprobs, versions


# `rollout_worker.type`: classes with the seed API's constructor
# `(config, inference_client, evaluator, publish, worker_id)`; a custom worker is named by
# `custom_rollout_worker_module_path` instead.
ROLLOUT_WORKERS: Registry[type] = Registry("rollout worker type", "rollout_worker.type")
register_rollout_worker = ROLLOUT_WORKERS.register


class BaseRolloutWorker:
    """Subclass and implement `rollout(task)`; publishing is done by `_put_trajectory`."""

    def __init__(self, config: dict, inference_client: InferenceClient, evaluator: Evaluator | None,
                 publish: Callable[[Any], None], worker_id: str = "worker"):
        self._config = _Namespace(config)
        self._inference_client = inference_client
        self.evaluator = evaluator
        self._publish = publish
        self.worker_id = worker_id
        self._local = threading.local()

    # --- the seed API --------------------------------------------------------------------
    def rollout(self, task: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        return str(data_item.get("prompt", ""))

    def get_train_loss_mask(self, prompt_tokens: list[int], response_tokens: list[int]) -> list[int]:
        return [0] * len(prompt_tokens) + [1] * len(response_tokens)

    def _put_trajectory(self, trajectory: Trajectory) -> str:
        task: Task = self._local.task
        if len(trajectory.loss_mask) != len(trajectory.tokens):
            self._local.error = (f"loss_mask has {len(trajectory.loss_mask)} entries for "
                                 f"{len(trajectory.tokens)} tokens")
            return FAIL
        if trajectory.logprobs is not None and len(trajectory.logprobs) != len(trajectory.tokens):
            self._local.error = (f"logprobs has {len(trajectory.logprobs)} entries for "
                                 f"{len(trajectory.tokens)} tokens")
            return FAIL
        if trajectory.token_versions is not None and len(trajectory.token_versions) != len(trajectory.tokens):
            self._local.error = (f"token_versions has {len(trajectory.token_versions)} entries for "
                                 f"{len(trajectory.tokens)} tokens")
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
        weight_version = trajectory.weight_version if trajectory.weight_version is not None else \
            (min(versions) if versions else 0)
        if weight_version < task.min_weight_version:
            return RE_ROLLOUT  # generated by a policy older than this task allows
        self._local.put = build_events(task, trajectory, logprobs, weight_version, completions, self.worker_id,
                                       token_versions)
        return SUCCESS

    # --- driving one task -----------------------------------------------------------------
    def run_task(self, task: Task, max_retries: int = 2) -> tuple[TrajectoryEvent, Evaluation]:
        """Roll `task` out (re-rolling when asked), then publish its trajectory and
        evaluation. A task always ends in a trajectory: a failure is recorded with its
        error and reward 0, so its group can complete."""
        error = "no trajectory"
        for _ in range(max_retries + 1):
            self._local.task, self._local.put, self._local.error = task, None, None
            self._inference_client.begin(is_val=task.is_val)
            try:
                status = self.rollout(task_dict(task))
            except InferenceUnavailable:
                raise  # not this task's failure: the worker stops and the task is rolled out again
            except Exception as exc:
                status, self._local.error = FAIL, f"{type(exc).__name__}: {exc}"
            if status == SUCCESS and self._local.put is not None:
                break
            error = self._local.error or f"rollout returned {status!r}"
        else:
            self._local.put = failed_events(task, error, self.worker_id)
        trajectory_event, evaluation = self._local.put
        self._publish(trajectory_event)
        self._publish(evaluation)
        return trajectory_event, evaluation


@register_rollout_worker("single_turn")
class SingleTurnWorker(BaseRolloutWorker):
    """The default worker: one completion of the formatted prompt, scored by the evaluator."""

    def rollout(self, task):
        prompt = self._inference_client.tokenize(self.format_task_query(task))
        limit = self._inference_client.max_prompt_tokens
        if limit is not None and len(prompt) > limit:
            raise ValueError(f"the prompt has {len(prompt)} tokens, more than max_prompt_length ({limit})")
        result = self._inference_client.completion(prompt)
        mask = self.get_train_loss_mask(result["prompt_tokens"], result["response_tokens"])
        outcome = run_evaluator(self.evaluator, task.get("data", {}), BaseEvaluationTarget(result["response"]))
        return self._put_trajectory(Trajectory(
            tokens=result["prompt_tokens"] + result["response_tokens"], loss_mask=mask,
            reward=outcome.result.reward, is_val=task.get("is_val", False),
            extra_fields={"metrics": outcome.result.metrics, "ground_truth": outcome.result.ground_truth,
                          "evaluator_error": outcome.error, "response": result["response"],
                          "finish_reason": result["finish_reason"]}))


class _Namespace(dict):
    """Config keys as attributes too (`self._config.temperature`), as the guide writes them."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"rollout_worker config has no key {name!r}") from None


def task_dict(task: Task) -> dict[str, Any]:
    row = dict(task.data)
    row.update(task_id=task.task_id, group_id=task.group_id, run_id=task.run_id, is_val=task.is_val,
               step=task.step, data=task.data, prompt=task.prompt if task.prompt else task.data.get("prompt", ""))
    return row


def build_events(task: Task, trajectory: Trajectory, logprobs: list[float], weight_version: int,
                 completions: list[Completion], worker_id: str, token_versions: list[int] | None = None
                 ) -> tuple[TrajectoryEvent, Evaluation]:
    extra = dict(trajectory.extra_fields)
    # Per-token versions are kept only when the sampled tokens span more than one version.
    sampled_versions = {v for v, m in zip(token_versions or [], trajectory.loss_mask) if m}
    spans_versions = len(sampled_versions) > 1
    metrics = {k: float(v) for k, v in (extra.pop("metrics", None) or {}).items()}
    prompt_length = next((i for i, m in enumerate(trajectory.loss_mask) if m), len(trajectory.tokens))
    event = TrajectoryEvent(
        run_id=task.run_id, trajectory_id=task.task_id, task_id=task.task_id, group_id=task.group_id,
        sample_index=task.sample_index, group_size=task.group_size, weight_version=weight_version,
        tokens=pack_int32(trajectory.tokens),
        loss_mask=pack_mask(trajectory.loss_mask), logprobs=pack_float32(logprobs), prompt_length=prompt_length,
        token_versions=pack_int32(token_versions) if spans_versions else b"",
        prompt_text=str(task.prompt), response_text=str(extra.get("response", "")),
        finish_reason=str(extra.pop("finish_reason", completions[-1].finish_reason if completions else "")),
        turns=[Turn(**turn) for turn in trajectory.turns or []], worker_id=worker_id, is_val=trajectory.is_val, step=task.step, extra_fields=extra)
    evaluation = Evaluation(
        run_id=task.run_id, trajectory_id=task.task_id, task_id=task.task_id, group_id=task.group_id,
        reward=float(trajectory.reward), metrics=metrics, ground_truth=extra.get("ground_truth"),
        evaluator="rollout", is_val=trajectory.is_val, step=task.step, error=extra.get("evaluator_error"))
    return event, evaluation


def failed_events(task: Task, error: str, worker_id: str) -> tuple[TrajectoryEvent, Evaluation]:
    event = TrajectoryEvent(run_id=task.run_id, trajectory_id=task.task_id, task_id=task.task_id,
                            group_id=task.group_id, sample_index=task.sample_index, group_size=task.group_size,
                            worker_id=worker_id,
                            is_val=task.is_val, step=task.step, finish_reason="error", error=error)
    evaluation = Evaluation(run_id=task.run_id, trajectory_id=task.task_id, task_id=task.task_id,
                            group_id=task.group_id, reward=0.0, evaluator="rollout", is_val=task.is_val,
                            step=task.step, error=error)
    return event, evaluation
