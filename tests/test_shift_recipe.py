"""The generation-heavy built-in recipe (recipes/shift): its data, its partial-credit
reward by hand, and GRPO raising its held-out score after the warm-up, end to end."""

from __future__ import annotations

import statistics

import pytest

from streamrl.producers.evaluator import BaseEvaluationTarget, run_evaluator
from streamrl.recipes.shift.data import shift_text, split_rows
from streamrl.recipes.shift.evaluator import ShiftEvaluator, letters_right
from tests.conftest import REPO, run_cli

RECIPE = str(REPO / "recipes" / "shift" / "recipe.yaml")


def test_every_letter_moves_one_place_on_and_z_wraps_to_a():
    assert shift_text("abz") == "bca"
    assert shift_text("hal") == "ibm"


def test_train_and_held_out_rows_share_no_prompt_and_have_the_asked_length():
    train, val = split_rows(50, 10, seed=3, length=12)
    assert len(train) == 50 and len(val) == 10
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    row = train[0]
    assert len(row["answer"]) == 12 and row["prompt"] == row["prompt"][:12] + "="
    assert row["answer"] == shift_text(row["prompt"][:12])


@pytest.mark.parametrize(
    ("output", "truth", "expected"),
    [
        ("bca", "bca", 1.0),
        ("bcx", "bca", 2 / 3),  # one wrong letter
        ("bc", "bca", 2 / 3),  # one missing at the end
        ("bcaa", "bca", 3 / 4),  # one extra: the longer length divides
        ("ca", "bca", 0.0),  # a dropped first letter misplaces the rest
        ("", "bca", 0.0),
    ],
)
def test_partial_credit_is_the_share_of_letters_right_in_place(output, truth, expected):
    assert letters_right(output, truth) == pytest.approx(expected)


def test_the_evaluator_rewards_partial_credit_and_reports_exact_match():
    partial = run_evaluator(ShiftEvaluator(), {"answer": "bcde"}, BaseEvaluationTarget(final_answer=" bcdx\n"))
    assert partial.result.reward == pytest.approx(0.75)
    assert partial.result.metrics["accuracy"] == 0.0
    exact = run_evaluator(ShiftEvaluator(), {"answer": "bcde"}, BaseEvaluationTarget(final_answer="bcde"))
    assert (exact.result.reward, exact.result.metrics["accuracy"]) == (1.0, 1.0)


def test_grpo_raises_the_held_out_score_after_the_warm_up_with_long_answers(stack, ledger, run_id, tmp_path):
    """The recipe as a user runs it (its own 200-step warm-up), 20 GRPO steps: rollouts
    sample 48+ tokens on average, and the held-out score rises by 0.1 or more."""
    result = run_cli(
        "run",
        RECIPE,
        "--run",
        run_id,
        "--out",
        str(tmp_path),
        timeout=600,
        env={"SHIFT_STEPS": "20", "SHIFT_VALIDATE_EVERY": "10"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    scores = dict(
        ledger.execute(
            "select step, avg(reward) from evaluations where run_id = %s and is_val group by step order by step", (run_id,)
        ).fetchall()
    )
    assert set(scores) == {0, 10, 20}
    assert scores[0] < 0.8, f"the warm-up should land part-way, not at {scores[0]:.3f}"
    assert scores[20] >= scores[0] + 0.1, scores
    masks = [row[0] for row in ledger.execute("select loss_mask from trajectories where run_id = %s and not is_val", (run_id,))]
    assert statistics.mean(sum(mask) for mask in masks) >= 48
