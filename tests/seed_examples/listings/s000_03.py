"""The guide's listing 000_03 (shared/seeds/000_*.txt, code block 3), as printed; only import lines differ."""

from streamrl.api import BaseRolloutWorker
from streamrl.api import Trajectory
from typing import Any
import logging

logger = logging.getLogger(__name__)

class MultiStepWorker(BaseRolloutWorker):
    """Worker with multi-step processing."""

    def rollout(self, task: dict[str, Any]) -> str | None:
        # Step 1: Generate reasoning
        reasoning_prompt = self._format_reasoning_prompt(task)
        reasoning_result = self._inference_client.completion(
            reasoning_prompt,
            temperature=0.8,  # Higher temperature for exploration
            max_tokens=1024
        )
        reasoning = reasoning_result["response"]

        # Step 2: Generate final answer based on reasoning
        answer_prompt = self._format_answer_prompt(task, reasoning)
        answer_result = self._inference_client.completion(
            answer_prompt,
            temperature=0.3,  # Lower temperature for final answer
            max_tokens=512
        )

        # Step 3: Combine trajectories
        # Merge prompt from step 1 with response from step 1 and prompt+response from step 2
        all_tokens = (
            reasoning_result["prompt_tokens"] +
            reasoning_result["response_tokens"] +
            answer_result["response_tokens"]  # Prompt overlaps, use only response
        )

        # Step 4: Create loss mask
        # Only train on final answer, mask out reasoning tokens
        loss_mask = (
            [0] * len(reasoning_result["prompt_tokens"]) +  # Mask prompt
            [0] * len(reasoning_result["response_tokens"]) +  # Mask reasoning
            [1] * len(answer_result["response_tokens"])  # Train on answer
        )

        # Step 5: Evaluate
        answer = self._extract_answer(answer_result["response"])
        reward = self._compute_reward(answer, task)

        # Step 6: Create trajectory
        trajectory = Trajectory(
            tokens=all_tokens,
            loss_mask=loss_mask,
            reward=reward,
            is_val=task.get("is_val", False),
            extra_fields={
                "ground_truth": task.get("answer", ""),
                "reasoning": reasoning,
                "final_answer": answer,
                "group_id": task.get("group_id", ""),
                "run_id": task.get("run_id", 0),
            }
        )

        return self._put_trajectory(trajectory)

    def _format_reasoning_prompt(self, task: dict) -> str:
        """Format prompt for reasoning step."""
        return f"Think step by step about: {task['question']}\n\nReasoning:"

    def _format_answer_prompt(self, task: dict, reasoning: str) -> str:
        """Format prompt for answer step."""
        return f"Question: {task['question']}\n\nReasoning: {reasoning}\n\nFinal Answer:"

    def _extract_answer(self, response: str) -> str:
        """Extract final answer."""
        # Implementation
        return response.strip()

    def _compute_reward(self, answer: str, task: dict) -> float:
        """Compute reward."""
        # Implementation
        return 1.0 if answer == task.get("answer", "") else 0.0
