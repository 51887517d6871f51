"""Where a response's final answer is, as pure functions: `builtin:math` grades only what
these return, and verl's reward rules (`builtin:verl`) pick theirs by data source.

`final_answer(text, marker)` looks, in order, for the last `\\boxed{...}`, the text after
the last `marker` (e.g. "####" or "The answer is"), and a response that is nothing but an
answer ("72", "$\\frac{1}{2}$", "x = 7"). It returns the answer's text and where it was
found, or (None, "none"): a truncated response ("Then 48 + 24 =") or an unevaluated one
("48 + 24", "\\boxed{48+24}") has no final answer, so a policy cannot learn to stop
before answering.

`gsm8k_answer(text, method)` is verl's GSM8K extraction (`verl/utils/reward_score/gsm8k.py`):
"strict" takes the last "#### N", "flexible" the last number, both in the last 300
characters, with commas and dollar signs removed; the score is string equality with the
ground truth, as verl's.
"""

from __future__ import annotations

import re

ANSWER_SOURCES = ("boxed", "marker", "whole")

_PURE_ARITHMETIC = re.compile(r"-?\d+(?:\.\d+)?(?:[+\-*\u00d7\u00b7]\d+(?:\.\d+)?)+")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces matched; None
    when there is none or its braces never close (a truncated response)."""
    starts = [m.end() for m in _BOX.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start:index].strip()
    return None


def _unwrapped(text: str) -> str:
    text = text.strip().rstrip(".").strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def is_lone_answer(text: str) -> bool:
    """A final value: a number, a fraction, a LaTeX or symbolic expression — not words,
    not an equation, not arithmetic on numbers left for the reader to do."""
    if not text or "=" in text or text.count("{") != text.count("}"):
        return False
    if _PURE_ARITHMETIC.fullmatch(re.sub(r"\s+", "", text)):
        return False
    return not _WORD.search(_LATEX_COMMAND.sub(" ", text))


def _whole(text: str) -> str | None:
    """The response is the answer, or `lhs = answer` where the left side is arithmetic or
    one variable ("48+24=72", "x = 7"), not prose."""
    text = _unwrapped(text)
    if "=" in text:
        lhs, _, text = text.rpartition("=")
        if _WORD.search(_LATEX_COMMAND.sub(" ", lhs)):
            return None
        text = _unwrapped(text)
    return text if is_lone_answer(text) else None


def final_answer(text: str, marker: str | None = None) -> tuple[str | None, str]:
    """(the answer's text, where it was found: one of ANSWER_SOURCES), or (None, "none")."""
    boxed = last_boxed(text)
    if boxed is not None:
        return (boxed, "boxed") if is_lone_answer(boxed) else (None, "none")
    if marker and marker in text:
        after = _unwrapped(text.rpartition(marker)[2].strip().split("\n", 1)[0])
        return (after, "marker") if is_lone_answer(after) else (None, "none")
    whole = _whole(text)
    return (whole, "whole") if whole is not None else (None, "none")


GSM8K_CLIP_CHARS = 300  # verl reads only the end of a response, where the answer is


def gsm8k_answer(text: str, method: str = "strict") -> str | None:
    """verl's GSM8K extraction: the last `#### N` (strict) or the last number (flexible)."""
    text = text[-GSM8K_CLIP_CHARS:]
    if method == "strict":
        found = re.findall(r"#### (\-?[0-9\.\,]+)", text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    if method != "flexible":
        raise ValueError(f"gsm8k method must be strict or flexible, not {method!r}")
    numbers = [n for n in re.findall(r"(\-?[0-9\.\,]+)", text) if n not in ("", ".")]
    return numbers[-1] if numbers else None
