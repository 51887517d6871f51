"""The shift recipe's evaluator: partial credit, the fraction of answer letters right.

reward = (letters equal to the answer's at the same position) / max(len(answer), len(output))

so a missing, extra or misplaced letter costs its share, and only the exact answer
scores 1. A dense reward: with 52 letters, a whole-answer exact match is rare early in
training and would give most groups no signal. `accuracy` (exact match) is reported
beside it and is what held-out accuracy means for this recipe.
"""

from streamrl.api import EvaluationRunResult, Evaluator


def letters_right(output: str, truth: str) -> float:
    width = max(len(output), len(truth))
    if width == 0:
        return 1.0
    return sum(a == b for a, b in zip(output, truth)) / width


class ShiftEvaluator(Evaluator):
    def evaluate(self, data, evaluation_target):
        truth = str(data["answer"]).strip()
        output = evaluation_target.final_answer.strip()
        return EvaluationRunResult(
            reward=letters_right(output, truth),
            ground_truth=truth,
            metrics={"accuracy": float(output == truth), "answer_length": float(len(output))},
        )
