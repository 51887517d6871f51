"""Evaluators: the seed API.

    class MyEvaluator(Evaluator):
        def evaluate(self, data, evaluation_target) -> EvaluationRunResult: ...

`data` is the task's dataset row; `evaluation_target.final_answer` is the model's
output text (and `observation` the agent trace, for agent workers). Load one from a
recipe with `evaluator_module_path: "path/to/file.py:ClassName"`.

`run_evaluator` never lets an evaluator crash a worker: an exception becomes reward 0
with the error recorded, and a reward that is not a finite number is refused the same way.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import Any

from streamrl.runtime.dataset import lookup
from streamrl.runtime.plugins import LoadError, load_class  # noqa: F401  (the seed API's loader, re-exported)


@dataclass
class BaseEvaluationTarget:
    final_answer: str
    observation: Any = None


@dataclass
class EvaluationRunResult:
    reward: float
    ground_truth: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    extra_info: dict[str, Any] = field(default_factory=dict)


NexAUEvaluationTarget = BaseEvaluationTarget  # the guide's name for an agent's target (final answer + trace)


class Evaluator:
    def evaluate(self, data: dict[str, Any], evaluation_target: BaseEvaluationTarget) -> EvaluationRunResult:
        raise NotImplementedError


@dataclass
class EvaluationOutcome:
    result: EvaluationRunResult
    error: str | None = None


def as_result(returned: Any, evaluator: str) -> EvaluationRunResult:
    """What an evaluator returned, as a result: an EvaluationRunResult, or verl's forms (a
    number, or a mapping with `score` and further metrics)."""
    if isinstance(returned, EvaluationRunResult):
        return returned
    if isinstance(returned, (int, float)):  # verl's compute_score: a float (or a bool)
        return EvaluationRunResult(reward=float(returned))
    if isinstance(returned, dict) and "score" in returned:  # verl's {"score": ..., "acc": ..., ...}
        metrics = {key: value for key, value in returned.items() if key != "score"}
        return EvaluationRunResult(reward=returned["score"], metrics=metrics)
    raise TypeError(
        f"{evaluator}.evaluate returned {type(returned).__name__}, expected an EvaluationRunResult, "
        "a number or a mapping with 'score' (verl's forms)"
    )


def checked_metrics(result: EvaluationRunResult) -> None:
    """Metrics as floats; one that is not a number is refused by name (kept in
    extra_info's refused_metrics, with its value's repr), never the whole evaluation."""
    metrics, refused = {}, {}
    for key, value in (result.metrics or {}).items():
        try:
            if not isinstance(value, (int, float, str)):
                raise TypeError
            metrics[str(key)] = float(value)
        except (TypeError, ValueError):
            refused[str(key)] = f"not a number: {value!r}"[:200]
    result.metrics = metrics
    if refused:
        result.extra_info = {**(result.extra_info or {}), "refused_metrics": refused}


def run_evaluator(evaluator: Evaluator, data: dict[str, Any], target: BaseEvaluationTarget) -> EvaluationOutcome:
    try:
        result = as_result(evaluator.evaluate(data, target), type(evaluator).__name__)
        reward = float(result.reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward {result.reward!r} is not a finite number")
        result.reward = reward
        checked_metrics(result)
        return EvaluationOutcome(result)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        return EvaluationOutcome(EvaluationRunResult(reward=0.0), error=error)


class ExactMatchEvaluator(Evaluator):
    """Reward 1 when the stripped output equals the row's `answer`."""

    answer_key = "answer"

    def evaluate(self, data, evaluation_target):
        truth = str(lookup(data, self.answer_key)).strip()  # no answer: an evaluator error, not a reward of 0
        output = evaluation_target.final_answer.strip()
        correct = float(output == truth)
        return EvaluationRunResult(reward=correct, ground_truth=truth, metrics={"accuracy": correct})
