"""The guide's listing 002_02 (shared/seeds/002_*.txt, code block 2), as printed; only import lines differ."""
from streamrl.api import EvaluationRunResult, Evaluator

from difflib import SequenceMatcher

class FuzzyMatchEvaluator(Evaluator):
    def __init__(self, threshold: float = 0.8):
        self.threshold = threshold

    def evaluate(self, data, evaluation_target):
        agent_answer = evaluation_target.final_answer.lower().strip()
        ground_truth = data["answer"].lower().strip()

        # Fuzzy match
        similarity = SequenceMatcher(None, agent_answer, ground_truth).ratio()
        reward = 1.0 if similarity >= self.threshold else 0.0

        metrics = {
            "similarity": float(similarity),
            "exact_match": float(agent_answer == ground_truth),
        }

        return EvaluationRunResult(
            reward=reward,
            ground_truth=ground_truth,
            metrics=metrics
        )
