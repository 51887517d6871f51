"""The guide's listing 002_01 (shared/seeds/002_*.txt, code block 1), as printed; only import lines differ."""

from streamrl.api import Evaluator, BaseEvaluationTarget, EvaluationRunResult
from typing import Any

class MyTaskEvaluator(Evaluator):
    """Evaluator for my specific task."""

    def evaluate(
        self,
        data: dict[str, Any],
        evaluation_target: BaseEvaluationTarget
    ) -> EvaluationRunResult:
        """
        Evaluate agent output.

        Args:
            data: Original data item with ground truth
            evaluation_target: Agent output with final_answer

        Returns:
            EvaluationRunResult with reward and metrics
        """
        # Extract agent answer
        agent_answer = evaluation_target.final_answer.strip()
        ground_truth = data.get("answer", "").strip()

        # Compute reward (0.0 to 1.0)
        reward = self._compute_reward(agent_answer, ground_truth)

        # Compute additional metrics (must be scalar floats)
        metrics = {
            "exact_match": float(agent_answer == ground_truth),
            "answer_length": float(len(agent_answer)),
        }

        # Store extra information
        extra_info = {
            "agent_answer": agent_answer,
            "ground_truth": ground_truth,
        }

        return EvaluationRunResult(
            reward=reward,
            ground_truth=ground_truth,
            metrics=metrics,
            extra_info=extra_info
        )

    def _compute_reward(self, prediction: str, ground_truth: str) -> float:
        """Compute reward for prediction."""
        if prediction == ground_truth:
            return 1.0
        else:
            return 0.0
