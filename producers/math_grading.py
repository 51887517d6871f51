"""math-verify's grading, with its own signal-based time limits off (they work only on
a process's main thread): `producers.child_pool.ChildPool` runs it in a child process
and enforces the limit from outside."""

from __future__ import annotations


def grade(truth: str, answer: str) -> tuple[float, float, str | None, bool]:
    """(correct, format_ok, the parsed answer, whether the truth parsed)."""
    import logging

    from math_verify import parse, verify

    # it warns at every call that its own limit is off: the parent enforces one
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    gold = parse(truth, parsing_timeout=None) or parse(f"${truth}$", parsing_timeout=None)
    if not gold:
        return 0.0, 0.0, None, False
    predicted = parse(answer, parsing_timeout=None)
    if not predicted:
        return 0.0, 0.0, None, True
    return float(verify(gold, predicted, timeout_seconds=None)), 1.0, str(predicted[-1]), True


def grade_verl_math(truth: str, answer: str) -> tuple[float, float]:
    """verl's math-verify rule (`verl/utils/reward_score/math_verify.py`): the truth read as
    `\\boxed{truth}`, the response's last expression or LaTeX answer; (score, whether the
    response held one)."""
    import logging

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse("\\boxed{" + truth + "}", extraction_config=(LatexExtractionConfig(),), parsing_timeout=None)
    predicted = parse(answer, extraction_config=(ExprExtractionConfig(), LatexExtractionConfig()), parsing_timeout=None)
    if not gold or not predicted:
        return 0.0, float(bool(predicted))
    return float(verify(gold, predicted, timeout_seconds=None)), 1.0
