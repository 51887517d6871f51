import math

import pytest

from streamrl.producers.evaluator import (
    BaseEvaluationTarget,
    EvaluationRunResult,
    Evaluator,
    ExactMatchEvaluator,
    LoadError,
    load_class,
    run_evaluator,
)


def test_exact_match():
    evaluator = ExactMatchEvaluator()
    good = run_evaluator(evaluator, {"answer": "5"}, BaseEvaluationTarget(" 5\n"))
    bad = run_evaluator(evaluator, {"answer": "5"}, BaseEvaluationTarget("6"))
    assert (good.result.reward, good.error) == (1.0, None)
    assert bad.result.reward == 0.0 and bad.result.metrics == {"accuracy": 0.0}


class Exploding(Evaluator):
    def evaluate(self, data, evaluation_target):
        raise RuntimeError("judge unreachable")


class NotANumber(Evaluator):
    def evaluate(self, data, evaluation_target):
        return EvaluationRunResult(reward=math.nan)


class WrongReturn(Evaluator):
    def evaluate(self, data, evaluation_target):
        return "1.0"  # a float, or verl's {"score": ...}, is a reward (tests/test_evaluator_builtins.py)


@pytest.mark.parametrize(
    "evaluator, message",
    [
        (Exploding(), "RuntimeError: judge unreachable"),
        (NotANumber(), "reward nan is not a finite number"),
        (WrongReturn(), "returned str, expected an EvaluationRunResult, a number or a mapping with 'score'"),
    ],
)
def test_a_failing_evaluator_gives_reward_zero_and_an_error(evaluator, message):
    outcome = run_evaluator(evaluator, {}, BaseEvaluationTarget("x"))
    assert outcome.result.reward == 0.0
    assert message in outcome.error


def test_load_class_from_a_file_that_imports_its_neighbour(tmp_path):
    (tmp_path / "helpers.py").write_text("def normalise(s):\n    return s.strip().lower()\n")
    (tmp_path / "my_eval.py").write_text(
        "from helpers import normalise\n"
        "from streamrl.api import EvaluationRunResult, Evaluator\n"
        "class Lower(Evaluator):\n"
        "    def evaluate(self, data, target):\n"
        "        return EvaluationRunResult(reward=float(normalise(target.final_answer) == data['answer']))\n"
    )
    cls = load_class("my_eval.py:Lower", tmp_path, expected=Evaluator)
    assert run_evaluator(cls(), {"answer": "yes"}, BaseEvaluationTarget(" YES ")).result.reward == 1.0


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon.py", "expected 'path/to/file.py:ClassName'"),
        ("missing.py:X", "file not found"),
        ("broken.py:X", "importing"),
        ("my_eval.py:Nope", "defines no class 'Nope'"),
        ("my_eval.py:NotEvaluator", "is not a subclass of Evaluator"),
    ],
)
def test_load_errors_name_the_problem(tmp_path, spec, message):
    (tmp_path / "broken.py").write_text("this is not python\n")
    (tmp_path / "my_eval.py").write_text("class NotEvaluator:\n    pass\n")
    with pytest.raises(LoadError, match=message):
        load_class(spec, tmp_path, expected=Evaluator)
