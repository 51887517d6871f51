"""verl's reward rules by data source (`builtin:verl`) and `builtin:math`'s final answer,
on hand-made responses whose scores were worked out by hand from verl's rules
(`verl/utils/reward_score/gsm8k.py`, `math_verify.py`): GSM8K's strict rule wants the
"#### N" its prompt asks for; its flexible rule takes the last number; `builtin:math`
grades only a final answer, so a truncated or unevaluated response scores 0."""

from __future__ import annotations

import pytest

from streamrl.producers.evaluator import BaseEvaluationTarget, run_evaluator
from streamrl.producers.evaluator_builtins import make_evaluator

TRUNCATED = "Natalia sold 48/2 = 24 clips in May. Then 48 + 24 ="
ANSWERED_THEN_MORE = "48+24=72\n#### 72\nThat took 2 steps."

# response, strict, flexible (ground truth "72", data_source openai/gsm8k)
GSM8K_CASES = [
    (TRUNCATED, 0.0, 0.0),  # no "####"; the last number is 24
    ("48 + 24", 0.0, 0.0),
    (ANSWERED_THEN_MORE, 1.0, 0.0),  # flexible: the last number is the 2 of "2 steps"
    ("\\boxed{72}", 0.0, 1.0),
    ("72", 0.0, 1.0),
    ("The answer is 72.", 0.0, 0.0),  # flexible reads "72." (the class holds "."), not "72"
    ("#### 72", 1.0, 1.0),
    ("#### 7,2", 1.0, 0.0),  # strict drops commas; flexible keeps "7,2"
    ("#### 72.00", 0.0, 0.0),  # string equality, as verl
    ("#### 71\n#### 72", 1.0, 1.0),  # the last "####"
    ("x" * 400 + "#### 72", 1.0, 1.0),
    ("#### 72" + "x" * 300, 0.0, 0.0),  # past verl's last 300 characters
]

# response, verl's math-verify score (ground truth "\\frac{1}{2}", data_source lighteval/MATH)
MATH_CASES = [
    ("so \\boxed{\\frac{1}{2}}", 1.0),
    ("\\boxed{0.5}", 1.0),
    ("The answer is $0.5$", 1.0),
    ("\\boxed{\\frac{1}{3}}", 0.0),
    ("no idea", 0.0),
]

# response, answer marker, builtin:math reward, where the answer was found (ground truth "72")
FINAL_ANSWER_CASES = [
    (TRUNCATED, None, 0.0, "none"),
    ("48 + 24", None, 0.0, "none"),  # an unevaluated expression is not an answer
    ("\\boxed{48+24}", None, 0.0, "none"),
    ("\\boxed{72", None, 0.0, "none"),  # truncated inside the box
    ("Then 48 + 24 = 72", None, 0.0, "none"),  # prose is not a lone answer
    (ANSWERED_THEN_MORE, None, 0.0, "none"),
    (ANSWERED_THEN_MORE, "####", 1.0, "marker"),
    ("The answer is 72.", "The answer is", 1.0, "marker"),
    ("The answer is 48 + 24.", "The answer is", 0.0, "none"),
    ("\\boxed{72}", None, 1.0, "boxed"),
    ("I think \\boxed{70}, no: \\boxed{72}", None, 1.0, "boxed"),
    ("72", None, 1.0, "whole"),
    ("$72$", None, 1.0, "whole"),
    ("48+24=72", None, 1.0, "whole"),
    ("71", None, 0.0, "whole"),
]


def score(spec: str, output: str, kwargs: dict | None = None, **row):
    outcome = run_evaluator(make_evaluator(spec, kwargs), row, BaseEvaluationTarget(output))
    assert outcome.error is None, outcome.error
    return outcome.result


@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_gsm8k_scores_as_verl(method):
    evaluator = make_evaluator("builtin:verl", {"gsm8k_method": method})
    row = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}}
    got = [evaluator.evaluate(row, BaseEvaluationTarget(text)).reward for text, *_ in GSM8K_CASES]
    column = 1 if method == "strict" else 2
    assert got == [case[column] for case in GSM8K_CASES]


def test_math_sources_score_with_math_verify_as_verl():
    evaluator = make_evaluator("builtin:verl", {})
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        row = {"data_source": source, "reward_model": {"ground_truth": "\\frac{1}{2}"}}
        got = [evaluator.evaluate(row, BaseEvaluationTarget(text)).reward for text, _ in MATH_CASES]
        assert got == [expected for _, expected in MATH_CASES], source


def test_an_unknown_data_source_is_an_error_naming_the_known_ones():
    outcome = run_evaluator(
        make_evaluator("builtin:verl", {}),
        {"data_source": "my/data", "reward_model": {"ground_truth": "1"}},
        BaseEvaluationTarget("#### 1"),
    )
    assert outcome.result.reward == 0.0
    assert "no reward rule for data_source 'my/data'" in outcome.error and "openai/gsm8k" in outcome.error


def test_builtin_math_grades_only_a_final_answer_and_says_where_it_found_it():
    got = []
    for text, marker, _, _ in FINAL_ANSWER_CASES:
        result = score("builtin:math", text, {"answer_marker": marker}, answer="72")
        found = [name for name in ("boxed", "marker", "whole") if result.metrics[f"answer_{name}"] == 1.0]
        got.append((result.reward, found[0] if found else "none"))
    assert got == [(reward, where) for _, _, reward, where in FINAL_ANSWER_CASES]
