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


def run_evaluator(evaluator: Evaluator, data: dict[str, Any], target: BaseEvaluationTarget) -> EvaluationOutcome:
    try:
        result = evaluator.evaluate(data, target)
        if not isinstance(result, EvaluationRunResult):
            raise TypeError(f"{type(evaluator).__name__}.evaluate returned {type(result).__name__}, expected EvaluationRunResult")
        reward = float(result.reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward {result.reward!r} is not a finite number")
        result.reward = reward
        result.metrics = {str(k): float(v) for k, v in (result.metrics or {}).items()}
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
