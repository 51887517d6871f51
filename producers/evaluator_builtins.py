"""Evaluators a recipe can use by name: `evaluator_module_path: "builtin:NAME"`, with
`evaluator_kwargs` passed to the constructor.

    exact_match      the stripped output equals the row's answer (optionally case-folded)
    regex            the first match of a pattern (group 1) equals the answer
    tag              the text inside <answer>...</answer> (any tag) equals the answer
    fuzzy            similarity to the answer in [0, 1] (rapidfuzz), or 1/0 past a threshold
    math             mathematical equivalence of the final answer (math-verify: LaTeX, fractions, \\boxed{})
    verl             verl's reward rules, chosen by the row's data_source (GSM8K's "#### N", MATH)
    code             the program in the output passes the row's tests in the sandbox
    weighted         a weighted mean of other evaluators' rewards (multi-criteria)
    llm_judge        a score from a judge model on any OpenAI-compatible endpoint

An output that does not have the expected shape (no tag, no code block, no number) is
a normal outcome: reward 0 and `format_ok` 0 in the metrics. Only a broken evaluator
(an unreachable judge, a bad pattern) raises, and `run_evaluator` turns that into
reward 0 with the error recorded.
"""

from __future__ import annotations

import inspect
import os
import re
from typing import Any

from streamrl.producers.child_pool import ChildPool
from streamrl.producers.evaluator import (
    BaseEvaluationTarget,
    EvaluationRunResult,
    Evaluator,
    ExactMatchEvaluator,
    run_evaluator,
)
from streamrl.producers.final_answer import ANSWER_SOURCES, final_answer, gsm8k_answer
from streamrl.producers.math_grading import grade, grade_verl_math
from streamrl.producers.sandbox import SandboxLimits, run_python
from streamrl.producers.verl_rules import rule_for
from streamrl.runtime.dataset import lookup
from streamrl.runtime.registry import Registry

# `rollout_worker.evaluator_module_path: builtin:NAME`: Evaluator classes, constructed
# with `rollout_worker.evaluator_kwargs`.
BUILTIN_EVALUATORS: Registry[type] = Registry("built-in evaluator", None)
register_evaluator = BUILTIN_EVALUATORS.register


def _answer(data: dict, key: str) -> str:
    """The row's reference answer; a row without one is an evaluator error (recorded with
    the rollout), never a silent reward of 0 against an empty answer."""
    try:
        return str(lookup(data, key)).strip()
    except KeyError as exc:
        raise KeyError(
            f"the task's row has no answer at {exc.args[0]} (data.answer_key, or the evaluator's answer_key)"
        ) from None


@register_evaluator("exact_match")
class ExactMatch(ExactMatchEvaluator):
    def __init__(self, answer_key: str = "answer", case_sensitive: bool = True):
        self.answer_key, self.case_sensitive = answer_key, case_sensitive

    def evaluate(self, data, evaluation_target):
        truth, output = _answer(data, self.answer_key), evaluation_target.final_answer.strip()
        if not self.case_sensitive:
            truth, output = truth.casefold(), output.casefold()
        correct = float(output == truth)
        return EvaluationRunResult(reward=correct, ground_truth=truth, metrics={"accuracy": correct})


@register_evaluator("regex")
class RegexExtract(Evaluator):
    """Extract with `pattern` (its first group, or the whole match), then compare."""

    def __init__(self, pattern: str, answer_key: str = "answer", case_sensitive: bool = True, last: bool = False):
        self.pattern = re.compile(pattern, re.DOTALL)  # a bad pattern fails here, when the recipe loads
        self.answer_key, self.case_sensitive, self.last = answer_key, case_sensitive, last

    def extract(self, text: str) -> str | None:
        matches = list(self.pattern.finditer(text))
        if not matches:
            return None
        match = matches[-1] if self.last else matches[0]
        return (match.group(1) if match.groups() else match.group(0)).strip()

    def evaluate(self, data, evaluation_target):
        truth = _answer(data, self.answer_key)
        extracted = self.extract(evaluation_target.final_answer)
        if extracted is None:
            return EvaluationRunResult(
                reward=0.0, ground_truth=truth, metrics={"accuracy": 0.0, "format_ok": 0.0}, extra_info={"extracted": None}
            )
        same = extracted == truth if self.case_sensitive else extracted.casefold() == truth.casefold()
        return EvaluationRunResult(
            reward=float(same),
            ground_truth=truth,
            metrics={"accuracy": float(same), "format_ok": 1.0},
            extra_info={"extracted": extracted},
        )


@register_evaluator("tag")
class TagExtract(RegexExtract):
    def __init__(self, tag: str = "answer", **kwargs):
        super().__init__(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", **kwargs)


@register_evaluator("fuzzy")
class FuzzyMatch(Evaluator):
    """rapidfuzz similarity (0..1) of output and answer; with `threshold`, 1 at or above it."""

    def __init__(self, answer_key: str = "answer", threshold: float | None = None, scorer: str = "ratio"):
        from rapidfuzz import fuzz

        if not hasattr(fuzz, scorer):
            raise ValueError(f"fuzzy: unknown scorer {scorer!r} (e.g. ratio, partial_ratio, token_sort_ratio)")
        self.scorer, self.answer_key, self.threshold = getattr(fuzz, scorer), answer_key, threshold

    def evaluate(self, data, evaluation_target):
        truth = _answer(data, self.answer_key)
        similarity = self.scorer(evaluation_target.final_answer.strip(), truth) / 100.0
        reward = similarity if self.threshold is None else float(similarity >= self.threshold)
        return EvaluationRunResult(reward=reward, ground_truth=truth, metrics={"similarity": similarity})


@register_evaluator("math")
class MathEquivalence(Evaluator):
    """Equivalence by math-verify of the response's final answer only
    (`producers/final_answer.py`): the last \\boxed{}, else the text after `answer_marker`
    (e.g. "####"), else a response that is nothing but an answer. "\\boxed{0.5}" matches
    "1/2"; a truncated or unevaluated response ("48 + 24 =") scores 0 with format_ok 0.
    The metrics say where the answer was found (answer_boxed, answer_marker, answer_whole).
    Graded in child processes (math-verify's own time limit needs the main thread; the
    evaluators run on worker threads): `timeout_s` a grading at most, then an error."""

    def __init__(self, answer_key: str = "answer", answer_marker: str | None = None, timeout_s: float = 10.0, processes: int = 2):
        self.answer_key, self.answer_marker = answer_key, answer_marker or None
        self.pool = ChildPool(grade, size=processes, timeout_s=timeout_s)

    def evaluate(self, data, evaluation_target):
        truth = _answer(data, self.answer_key)
        answer, source = final_answer(evaluation_target.final_answer, self.answer_marker)
        found = {f"answer_{name}": float(source == name) for name in ANSWER_SOURCES}
        if answer is None:
            return EvaluationRunResult(reward=0.0, ground_truth=truth, metrics={"accuracy": 0.0, "format_ok": 0.0, **found})
        try:
            correct, format_ok, parsed, truth_parsed = self.pool(truth, f"${answer}$")
        except TimeoutError as exc:
            raise TimeoutError(f"math: grading {answer[:80]!r} {exc}") from None
        if not truth_parsed:
            raise ValueError(f"math: the row's {self.answer_key!r} ({truth!r}) does not parse as math")
        return EvaluationRunResult(
            reward=correct,
            ground_truth=truth,
            metrics={"accuracy": correct, "format_ok": format_ok, **found},
            extra_info={"answer": answer, "parsed": parsed},
        )


@register_evaluator("verl")
class VerlRules(Evaluator):
    """verl's reward rules, chosen by the row's `data_source` as verl's
    `default_compute_score` chooses them (`producers/verl_rules.py`): GSM8K's "#### N"
    (strict, or flexible: the last number) and math-verify for MATH-style answers. A
    data source without a rule is refused by `recipe validate`."""

    def __init__(
        self,
        answer_key: str = "reward_model.ground_truth",
        data_source_key: str = "data_source",
        gsm8k_method: str = "strict",
        timeout_s: float = 10.0,
        processes: int = 2,
    ):
        if gsm8k_method not in ("strict", "flexible"):
            raise ValueError(f"verl: gsm8k_method must be strict or flexible, not {gsm8k_method!r}")
        self.answer_key, self.data_source_key, self.gsm8k_method = answer_key, data_source_key, gsm8k_method
        self.pool = ChildPool(grade_verl_math, size=processes, timeout_s=timeout_s)

    def evaluate(self, data, evaluation_target):
        truth, output = _answer(data, self.answer_key), evaluation_target.final_answer
        rule = rule_for(lookup(data, self.data_source_key, None))
        if rule == "gsm8k":
            answer = gsm8k_answer(output, self.gsm8k_method)
            score, format_ok = float(answer == truth), float(answer is not None)
        else:
            try:
                score, format_ok = self.pool(truth, output)
            except TimeoutError as exc:
                raise TimeoutError(f"verl math: grading {output[:80]!r} {exc}") from None
        return EvaluationRunResult(
            reward=score, ground_truth=truth, metrics={"accuracy": score, "format_ok": format_ok}, extra_info={"rule": rule}
        )


CODE_BLOCK_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The last fenced code block, or None when the output has none."""
    blocks = CODE_BLOCK_RE.findall(text)
    return blocks[-1] if blocks else None


@register_evaluator("code")
class CodeExecution(Evaluator):
    """Runs the output's last ```python block against the row's tests in the sandbox.

    Tests (the row's `tests_key`): a list of {"stdin": ..., "stdout": ...} cases (the
    program's stripped output must equal "stdout"), or a string of Python asserts run
    after the program. Reward: the fraction of cases passed (1/0 for asserts)."""

    def __init__(
        self,
        tests_key: str = "tests",
        wall_seconds: float = 5.0,
        cpu_seconds: int = 5,
        memory_mb: int = 512,
        max_processes: int = 16,
    ):
        self.tests_key = tests_key
        self.limits = SandboxLimits(
            wall_seconds=wall_seconds, cpu_seconds=cpu_seconds, memory_mb=memory_mb, max_processes=max_processes
        )

    def evaluate(self, data, evaluation_target):
        tests = data.get(self.tests_key)
        if tests is None:
            raise ValueError(f"code: the row has no {self.tests_key!r}")
        code = extract_code(evaluation_target.final_answer)
        if code is None:
            return EvaluationRunResult(reward=0.0, metrics={"pass_rate": 0.0, "format_ok": 0.0})
        cases = (
            [{"stdin": "", "program": code + "\n\n" + tests}]
            if isinstance(tests, str)
            else [{"stdin": str(t.get("stdin", "")), "stdout": str(t.get("stdout", "")), "program": code} for t in tests]
        )
        passed, statuses = 0, []
        for case in cases:
            result = run_python(case["program"], case["stdin"], self.limits)
            ok = result.ok and ("stdout" not in case or result.stdout.strip() == case["stdout"].strip())
            passed += ok
            statuses.append(result.status)
        rate = passed / len(cases) if cases else 0.0
        return EvaluationRunResult(
            reward=rate,
            metrics={"pass_rate": rate, "format_ok": 1.0, "timeouts": float(statuses.count("timeout"))},
            extra_info={"statuses": statuses},
        )


@register_evaluator("weighted")
class Weighted(Evaluator):
    """criteria: [{evaluator: "builtin:tag", weight: 0.8, kwargs: {...}}, ...]; the reward
    is the weighted mean, and each criterion's reward is a metric."""

    def __init__(self, criteria: list[dict[str, Any]], answer_key: str | None = None):
        if not criteria:
            raise ValueError("weighted: criteria must name at least one evaluator")
        self.criteria = []
        for i, criterion in enumerate(criteria):
            if "evaluator" not in criterion:
                raise ValueError(f"weighted: criteria[{i}].evaluator is required")
            name = criterion.get("name") or criterion["evaluator"].split(":")[-1]
            self.criteria.append(
                (
                    name,
                    float(criterion.get("weight", 1.0)),
                    make_evaluator(criterion["evaluator"], criterion.get("kwargs") or {}, answer_key=answer_key),
                )
            )
        if sum(w for _, w, _ in self.criteria) <= 0:
            raise ValueError("weighted: the weights must add up to more than 0")

    def evaluate(self, data, evaluation_target):
        total, weights, metrics, errors = 0.0, 0.0, {}, {}
        for name, weight, evaluator in self.criteria:
            outcome = run_evaluator(evaluator, data, evaluation_target)
            total += weight * outcome.result.reward
            weights += weight
            metrics[f"{name}_reward"] = outcome.result.reward
            if outcome.error:
                errors[name] = outcome.error
        return EvaluationRunResult(reward=total / weights, metrics=metrics, extra_info={"errors": errors} if errors else {})


@register_evaluator("llm_judge")
class LLMJudge(Evaluator):
    """Asks a judge model (any OpenAI-compatible /v1/chat/completions) to grade the output.

    The prompt template sees {question}, {answer} (the reference) and {response}; the
    judge's reply must contain "SCORE: n" (0..max_score); reward = n / max_score."""

    DEFAULT_PROMPT = (
        "Grade the response to the question against the reference answer.\n"
        "Question: {question}\nReference answer: {answer}\nResponse: {response}\n"
        "Reply with a short reason, then a line 'SCORE: n' with n from 0 to {max_score}."
    )

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        prompt: str | None = None,
        max_score: int = 10,
        question_key: str = "prompt",
        answer_key: str = "answer",
        temperature: float = 0.0,
        timeout_s: float = 60.0,
        max_retries: int = 2,
    ):
        from openai import OpenAI

        self.client = OpenAI(
            base_url=base_url, api_key=os.environ.get(api_key_env) or "none", timeout=timeout_s, max_retries=max_retries
        )
        self.model, self.prompt, self.max_score = model, prompt or self.DEFAULT_PROMPT, max_score
        self.question_key, self.answer_key, self.temperature = question_key, answer_key, temperature

    def evaluate(self, data, evaluation_target):
        prompt = self.prompt.format(
            question=lookup(data, self.question_key, ""),
            answer=lookup(data, self.answer_key, ""),
            response=evaluation_target.final_answer,
            max_score=self.max_score,
        )
        reply = self.client.chat.completions.create(
            model=self.model, temperature=self.temperature, messages=[{"role": "user", "content": prompt}]
        )
        text = reply.choices[0].message.content or ""
        match = re.search(r"SCORE:\s*(-?\d+(?:\.\d+)?)", text)
        if match is None:
            return EvaluationRunResult(reward=0.0, metrics={"judge_format_ok": 0.0}, extra_info={"judge_reply": text[:2000]})
        score = min(max(float(match.group(1)), 0.0), float(self.max_score))
        return EvaluationRunResult(
            reward=score / self.max_score,
            metrics={"judge_score": score, "judge_format_ok": 1.0},
            extra_info={"judge_reply": text[:2000]},
        )


def make_evaluator(
    spec: str | None, kwargs: dict[str, Any] | None = None, base_dir: str = ".", answer_key: str | None = None
) -> Evaluator:
    """ "builtin:NAME" or "file.py:Class", constructed with `kwargs`; None gives exact match.
    A built-in evaluator reads the answer at `answer_key` (data.answer_key) unless its
    kwargs name another."""
    from streamrl.runtime.plugins import LoadError, load_class

    kwargs = dict(kwargs or {})
    if not spec:
        spec = "builtin:exact_match"
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN_EVALUATORS:
            raise LoadError(f"{spec!r}: no built-in evaluator {name!r} (built in: {', '.join(BUILTIN_EVALUATORS.names())})")
        cls = BUILTIN_EVALUATORS.get(name)
        if answer_key and "answer_key" not in kwargs and "answer_key" in inspect.signature(cls).parameters:
            kwargs["answer_key"] = answer_key
    else:
        cls = load_class(spec, base_dir, Evaluator)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise LoadError(f"{spec!r}: evaluator_kwargs do not fit {cls.__name__}: {exc}") from None


__all__ = ["BUILTIN_EVALUATORS", "BaseEvaluationTarget", "extract_code", "make_evaluator"]
