"""The guide's listing 001_16 (shared/seeds/001_*.txt, code block 16), as printed; only import lines differ."""
import re
from typing import Any
from streamrl.api import BaseNexAURolloutWorker, EvaluationRunResult, Evaluator

class ReasoningWorker(BaseNexAURolloutWorker):
    """Worker that encourages step-by-step reasoning."""

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        """Format query to encourage reasoning."""
        question = data_item.get("question", "")

        query = f"""Question: {question}

Please solve this step by step:
1. First, identify what is being asked
2. Then, break down the problem
3. Show your reasoning at each step
4. Finally, provide your answer

Format your response as:
<reasoning>
Your step-by-step thinking here
</reasoning>
<answer>
Your final answer here
</answer>"""

        return query

class ReasoningEvaluator(Evaluator):
    """Evaluator that rewards both correctness and reasoning."""

    def evaluate(self, data, evaluation_target):
        response = evaluation_target.final_answer

        # Extract components
        reasoning = self.extract_reasoning(response)
        answer = self.extract_answer(response)

        # Evaluate correctness
        ground_truth = data.get("answer", "")
        correctness = float(answer == ground_truth)

        # Evaluate reasoning quality (simple heuristic)
        reasoning_quality = self.eval_reasoning_quality(reasoning)

        # Combined reward
        reward = 0.7 * correctness + 0.3 * reasoning_quality

        return EvaluationRunResult(
            reward=reward,
            ground_truth=ground_truth,
            metrics={
                "correctness": correctness,
                "reasoning_quality": reasoning_quality,
                "has_reasoning": float(reasoning is not None),
            }
        )

    def extract_reasoning(self, response: str) -> str | None:
        match = re.search(r"<reasoning>(.*?)</reasoning>", response, re.DOTALL)
        return match.group(1).strip() if match else None

    def extract_answer(self, response: str) -> str:
        match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)
        return match.group(1).strip() if match else ""

    def eval_reasoning_quality(self, reasoning: str | None) -> float:
        """Simple reasoning quality heuristic."""
        if reasoning is None:
            return 0.0

        # Check for step markers
        has_steps = any(marker in reasoning for marker in ["1.", "Step", "First"])

        # Check length (reasonable reasoning should be substantial)
        reasonable_length = 50 < len(reasoning) < 1000

        return 1.0 if (has_steps and reasonable_length) else 0.5
