"""The guide's listing 001_01 (shared/seeds/001_*.txt, code block 1), as printed; only import lines differ."""

from streamrl.api import Evaluator, BaseEvaluationTarget, EvaluationRunResult

class MyEvaluator(Evaluator):
    def evaluate(self, data, evaluation_target):
        # Your evaluation logic
        reward = 1.0 if evaluation_target.final_answer == data["answer"] else 0.0
        return EvaluationRunResult(reward=reward)
