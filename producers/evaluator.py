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

import importlib.util
import math
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
            raise TypeError(f"{type(evaluator).__name__}.evaluate returned {type(result).__name__}, "
                            "expected EvaluationRunResult")
        reward = float(result.reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward {result.reward!r} is not a finite number")
        result.reward = reward
        result.metrics = {str(k): float(v) for k, v in (result.metrics or {}).items()}
        return EvaluationOutcome(result)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        return EvaluationOutcome(EvaluationRunResult(reward=0.0), error=error)


class LoadError(ValueError):
    pass


def load_class(spec: str, base_dir: str | Path = ".", expected: type | None = None) -> type:
    """The class named by "path/to/file.py:ClassName" (the path relative to `base_dir`).
    The file's folder goes on sys.path so the module can import its neighbours."""
    path_text, sep, class_name = spec.rpartition(":")
    if not sep or not path_text or not class_name:
        raise LoadError(f"{spec!r}: expected 'path/to/file.py:ClassName'")
    path = (Path(base_dir) / path_text).resolve()
    if not path.is_file():
        raise LoadError(f"{spec!r}: file not found: {path}")
    module_name = f"streamrl_user_{path.stem}_{abs(hash(str(path)))}"
    if module_name not in sys.modules:
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise LoadError(f"{spec!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    cls = getattr(sys.modules[module_name], class_name, None)
    if not isinstance(cls, type):
        raise LoadError(f"{spec!r}: {path.name} defines no class {class_name!r}")
    if expected is not None and not issubclass(cls, expected):
        raise LoadError(f"{spec!r}: {class_name} is not a subclass of {expected.__name__}")
    return cls


class ExactMatchEvaluator(Evaluator):
    """Reward 1 when the stripped output equals the row's `answer`."""

    answer_key = "answer"

    def evaluate(self, data, evaluation_target):
        truth = str(data.get(self.answer_key, "")).strip()
        output = evaluation_target.final_answer.strip()
        correct = float(output == truth)
        return EvaluationRunResult(reward=correct, ground_truth=truth, metrics={"accuracy": correct})
