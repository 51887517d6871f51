"""User guide and recipe-development chapters: the agent worker overrides
(format_task_query, get_train_loss_mask in its three forms, conditional patterns) and
the evaluators."""

import re
from typing import Any

from streamrl.api import BaseEvaluationTarget, BaseNexAURolloutWorker, EvaluationRunResult, Evaluator


class MyTaskWorker(BaseNexAURolloutWorker):
    """Custom worker with specialized query formatting."""

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        # Example: Math problem formatting
        problem = data_item.get("problem", "")
        context = data_item.get("context", "")

        query = f"Problem: {problem}\n"
        if context:
            query += f"Context: {context}\n"
        query += "\nProvide your solution step by step."

        return query


class AllResponsesWorker(BaseNexAURolloutWorker):  # "Example 1: Train on all response tokens (default)"
    def get_train_loss_mask(self, trajectory_infos: list[dict]) -> list[bool]:
        return [True] * len(trajectory_infos)


class NoToolCallWorker(BaseNexAURolloutWorker):  # "Example 2: Skip tool call tokens, only train on final answer"
    def get_train_loss_mask(self, trajectory_infos: list[dict]) -> list[bool]:
        mask = []
        for traj in trajectory_infos:
            response_msg = traj.get("response_message", {})
            # Skip if message contains tool calls
            has_tool_calls = bool(response_msg.get("tool_calls"))
            mask.append(not has_tool_calls)
        return mask


class FinalOnlyWorker(BaseNexAURolloutWorker):  # recipe chapter: "Only train on final answer"
    def get_train_loss_mask(self, trajectory_infos: list[dict]) -> list[bool]:
        """Custom loss mask for training."""
        mask = []
        for traj_info in trajectory_infos:
            # Only train on final answer, not intermediate steps
            is_final_answer = traj_info.get("is_final", False)
            mask.append(is_final_answer)
        return mask


class MultiTurnWorker(BaseNexAURolloutWorker):
    """Worker for multi-turn conversation tasks."""

    def format_task_query(self, data_item: dict[str, Any]) -> str:
        """Format conversation history into query."""
        conversation = data_item.get("conversation", [])

        # Format each turn
        formatted_turns = []
        for turn in conversation:
            role = turn.get("role", "user")
            content = turn.get("content", "")
            formatted_turns.append(f"{role}: {content}")

        # Add current query
        current_query = data_item.get("query", "")
        formatted_turns.append(f"user: {current_query}")
        formatted_turns.append("assistant:")

        return "\n".join(formatted_turns)


class MyEvaluator(Evaluator):
    """Evaluator for my task."""

    def __init__(self):
        """Initialize evaluator with any needed resources."""
        super().__init__()

    def evaluate(
        self,
        data: dict[str, Any],
        evaluation_target: BaseEvaluationTarget
    ) -> EvaluationRunResult:
        # Extract agent output
        agent_output = evaluation_target.final_answer

        # Get ground truth
        ground_truth = data.get("answer", "")

        # Compute reward (main training signal)
        reward = self._compute_reward(agent_output, ground_truth)

        # Compute additional metrics (must be floats)
        metrics = self._compute_metrics(agent_output, ground_truth, data)

        # Store extra information (any type)
        extra_info = {
            "agent_output": agent_output,
            "data_id": data.get("id", ""),
        }

        return EvaluationRunResult(
            reward=reward,
            ground_truth=str(ground_truth),
            metrics=metrics,
            extra_info=extra_info
        )

    def _compute_reward(self, output: str, ground_truth: str) -> float:
        """Compute primary reward signal."""
        # Exact match
        return 1.0 if output.strip() == ground_truth.strip() else 0.0

    def _compute_metrics(
        self,
        output: str,
        ground_truth: str,
        data: dict
    ) -> dict[str, float]:
        """Compute additional metrics for logging."""
        return {
            "exact_match": float(output.strip() == ground_truth.strip()),
            "output_length": float(len(output)),
        }


class ExtractorEvaluator(Evaluator):
    """Evaluator that extracts structured answers."""

    def extract_answer(self, response: str) -> str | None:
        """Extract answer from formatted response."""
        # Example: Extract content between tags
        match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)
        if match:
            return match.group(1).strip()
        return None

    def evaluate(self, data, evaluation_target):
        # Extract structured answer
        extracted = self.extract_answer(evaluation_target.final_answer)

        if extracted is None:
            # No valid answer found - penalize
            return EvaluationRunResult(
                reward=0.0,
                metrics={"extraction_failed": 1.0}
            )

        # Compare extracted answer
        ground_truth = data.get("answer", "")
        reward = float(extracted == ground_truth)

        return EvaluationRunResult(
            reward=reward,
            ground_truth=ground_truth,
            metrics={
                "extraction_success": 1.0,
                "exact_match": reward,
            }
        )


class MultiCriteriaEvaluator(Evaluator):
    """Evaluator with multiple weighted criteria."""

    def __init__(self):
        super().__init__()
        # Define criterion weights
        self.weights = {
            "correctness": 0.5,
            "completeness": 0.3,
            "clarity": 0.2,
        }

    def evaluate(self, data, evaluation_target):
        output = evaluation_target.final_answer
        ground_truth = data.get("answer", "")

        # Evaluate each criterion
        scores = {
            "correctness": self._eval_correctness(output, ground_truth),
            "completeness": self._eval_completeness(output, data),
            "clarity": self._eval_clarity(output),
        }

        # Compute weighted reward
        reward = sum(
            scores[k] * self.weights[k]
            for k in self.weights
        )

        return EvaluationRunResult(
            reward=reward,
            ground_truth=ground_truth,
            metrics=scores  # Log individual scores
        )

    def _eval_correctness(self, output: str, ground_truth: str) -> float:
        """Evaluate correctness (0-1)."""
        return float(output.strip() == ground_truth.strip())

    def _eval_completeness(self, output: str, data: dict) -> float:
        """Evaluate completeness (0-1)."""
        required_points = data.get("required_points", [])
        covered = sum(
            1 for point in required_points
            if point.lower() in output.lower()
        )
        return covered / max(len(required_points), 1)

    def _eval_clarity(self, output: str) -> float:
        """Evaluate clarity (0-1)."""
        # Simple heuristic - can be more sophisticated
        word_count = len(output.split())
        # Penalize very short or very long outputs
        if word_count < 10:
            return 0.3
        elif word_count > 500:
            return 0.6
        else:
            return 1.0


class FuzzyMatchEvaluator(Evaluator):
    def __init__(self, threshold: float = 0.8):
        self.threshold = threshold

    def evaluate(self, data, evaluation_target):
        from difflib import SequenceMatcher
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


# "Type 2: NexAU Custom Worker" (workers chapter), imports pointed at streamrl.api
from dataclasses import dataclass, field  # noqa: E402

from streamrl.api import EvaluationRunResult as _Result, InMemoryTracer, NexAUEvaluationTarget  # noqa: E402,F401

import logging  # noqa: E402

logger = logging.getLogger(__name__)


class MyAgentWorker(BaseNexAURolloutWorker):
    """Custom NexAU worker with specialized query formatting."""

    def run_agent(self, task: dict[str, Any]) -> tuple[Any, EvaluationRunResult]:
        # 1. Custom query formatting
        query = self._format_query(task)

        # 2. Load agent with custom LLM client
        agent, client_provider_func = self.load_agent_from_config(
            custom_llm_client_provider=lambda: self._inference_client
        )

        # 3. Run agent
        response = agent.run(query, custom_llm_client_provider=client_provider_func)

        # 4. Extract traces
        traces = []
        for tracer in agent.config.tracers:
            if isinstance(tracer, InMemoryTracer):
                traces = tracer.dump_traces()
                break

        # 5. Process traces
        trajectories = self.trace_processor(traces)

        # 6. Create agent output
        @dataclass
        class AgentOutput:
            final_answer: str
            observation: list
            rl_params: dict = field(default_factory=dict)

        agent_output = AgentOutput(
            final_answer=response,
            observation=agent.history,
            rl_params={"trajectory": trajectories}
        )

        # 7. Evaluate
        evaluation_result = self.evaluator.evaluate(
            task,
            NexAUEvaluationTarget(
                final_answer=agent_output.final_answer,
                observation=agent_output.observation
            ),
        )

        # 8. Attach reward to trajectories
        for traj in trajectories:
            traj["reward"] = evaluation_result.reward
            traj["score"] = {
                "reward_score": evaluation_result.reward,
                **evaluation_result.metrics,
            }

        return agent_output, evaluation_result

    def _format_query(self, task: dict[str, Any]) -> str:
        """
        Custom query formatting for specific task.

        This is where task-specific prompt engineering happens.
        """
        # Example: Structured query format
        instruction = task.get("instruction", "")
        context = task.get("context", "")
        examples = task.get("examples", [])

        query_parts = []

        if instruction:
            query_parts.append(f"Instruction: {instruction}")

        if context:
            query_parts.append(f"\nContext: {context}")

        if examples:
            query_parts.append("\nExamples:")
            for i, ex in enumerate(examples, 1):
                query_parts.append(f"{i}. {ex}")

        query_parts.append("\nPlease solve the task:")

        return "\n".join(query_parts)
