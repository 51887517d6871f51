"""Which of verl's reward rules a row's `data_source` picks, as verl's
`verl/utils/reward_score/__init__.py:default_compute_score` picks it, for the rules
StreamRL implements (`builtin:verl`). A data source verl scores with a rule StreamRL does
not implement (code, geometry, search QA, DAPO's "Answer:") is refused by
`recipe validate`, with the known ones listed, rather than scored by the wrong rule.
"""

from __future__ import annotations

# data_source -> rule: "gsm8k" (verl's gsm8k.compute_score), "math" (verl's math-verify rule)
DATA_SOURCE_RULES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
}


class UnknownDataSource(ValueError):
    pass


def rule_for(data_source: object) -> str:
    """The rule of `data_source`, or UnknownDataSource naming the known ones."""
    rule = DATA_SOURCE_RULES.get(data_source) if isinstance(data_source, str) else None
    if rule is None:
        raise UnknownDataSource(
            f"builtin:verl has no reward rule for data_source {data_source!r} "
            f"(known: {', '.join(DATA_SOURCE_RULES)}; any other needs its own evaluator)"
        )
    return rule
