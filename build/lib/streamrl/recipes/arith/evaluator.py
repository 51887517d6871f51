"""The arithmetic recipe's evaluator (the seed API): reward 1 for the exact answer.

Also reports whether the answer was well-formed (digits only), so a run can tell a
model that answers wrongly from one that has not learned the format.
"""

from streamrl.api import EvaluationRunResult, Evaluator


class ArithEvaluator(Evaluator):
    def evaluate(self, data, evaluation_target):
        truth = str(data["answer"]).strip()
        output = evaluation_target.final_answer.strip()
        correct = float(output == truth)
        return EvaluationRunResult(
            reward=correct, ground_truth=truth, metrics={"accuracy": correct, "well_formed": float(output.isdigit())}
        )
