"""Chapter "Creating Custom Rollout Workers": types 1 and 3, patterns 1, 2, 3 and 4,
the configuration and reusability examples."""

import logging
from typing import Any

from streamrl.api import BaseNexAURolloutWorker, BaseRolloutWorker, Trajectory

logger = logging.getLogger(__name__)


class MySimpleWorker(BaseRolloutWorker):
    """Custom worker for simple tasks."""

    def rollout(self, task: dict[str, Any]) -> str | None:
        # 1. Extract and validate task data
        if "question" not in task:
            logger.error("Task missing 'question' field")
            return None

        question = task["question"]
        context = task.get("context", "")

        # 2. Format prompt
        prompt = self._format_prompt(question, context)

        # 3. Call LLM
        result = self._inference_client.completion(
            prompt,
            temperature=self._config.temperature,
            max_tokens=self._config.max_tokens
        )

        # 4. Process response
        answer = self._extract_answer(result["response"])

        # 5. Evaluate
        reward = self._compute_reward(answer, task)

        # 6. Create trajectory
        trajectory = Trajectory(
            tokens=result["prompt_tokens"] + result["response_tokens"],
            loss_mask=[0] * len(result["prompt_tokens"]) + [1] * len(result["response_tokens"]),
            reward=reward,
            is_val=task.get("is_val", False),
            extra_fields={
                "ground_truth": task.get("answer", ""),
                "group_id": task.get("group_id", ""),
                "run_id": task.get("run_id", 0),
                "extracted_answer": answer,
            }
        )

        # 7. Submit
        return self._put_trajectory(trajectory)

    def _format_prompt(self, question: str, context: str) -> str:
        """Format task-specific prompt."""
        if context:
            return f"Context: {context}\n\nQuestion: {question}\n\nAnswer:"
        return f"Question: {question}\n\nAnswer:"

    def _extract_answer(self, response: str) -> str:
        """Extract answer from response."""
        # Task-specific extraction logic
        import re
        match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)
        return match.group(1).strip() if match else response.strip()

    def _compute_reward(self, answer: str, task: dict) -> float:
        """Compute reward."""
        ground_truth = task.get("answer", "")
        return 1.0 if answer.strip() == ground_truth.strip() else 0.0


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


class TemplateWorker(BaseRolloutWorker):
    def __init__(self, config):
        super().__init__(config)
        # Load prompt templates
        self.system_prompt = self._load_system_prompt()
        self.few_shot_examples = self._load_examples()

    def rollout(self, task):
        # Build prompt from templates
        prompt = self._build_prompt(task)
        result = self._inference_client.completion(prompt)
        # ... process result

    def _build_prompt(self, task):
        """Build prompt from templates."""
        parts = [self.system_prompt]

        # Add few-shot examples
        for example in self.few_shot_examples:
            parts.append(f"Q: {example['question']}")
            parts.append(f"A: {example['answer']}")

        # Add current task
        parts.append(f"Q: {task['question']}")
        parts.append("A:")

        return "\n\n".join(parts)

    def _load_system_prompt(self):
        """Load system prompt from file."""
        # Implementation
        return "You are a helpful assistant."

    def _load_examples(self):
        """Load few-shot examples."""
        # Implementation
        return []


class ToolIntegratedWorker(BaseRolloutWorker):
    def __init__(self, config):
        super().__init__(config)
        self.api_client = self._init_api_client()

    def rollout(self, task):
        # Step 1: Query external API
        api_result = self.api_client.query(task["query"])

        # Step 2: Format prompt with API result
        prompt = self._format_prompt_with_context(task, api_result)

        # Step 3: Generate response
        llm_result = self._inference_client.completion(prompt)

        # Step 4: Create trajectory
        trajectory = self._create_trajectory(llm_result, task)
        return self._put_trajectory(trajectory)

    def _init_api_client(self):
        """Initialize external API client."""
        # Implementation
        return None


class CustomTokenWorker(BaseNexAURolloutWorker):
    def get_train_loss_mask(self, trajectory_infos: list[dict]) -> list[bool]:
        """
        Custom loss masking logic.

        Example: Only train on tokens after specific marker.
        """
        mask = []

        for traj in trajectory_infos:
            response_tokens = traj.get("response_tokens", [])
            response_text = self.tokenizer.decode(response_tokens)

            # Find marker position
            marker = "<final_answer>"
            if marker in response_text:
                # Tokenize up to marker to find split point
                marker_tokens = self.tokenizer.encode(marker, add_special_tokens=False)

                # Find marker position in tokens
                marker_pos = self._find_sublist(response_tokens, marker_tokens)

                if marker_pos >= 0:
                    # Mask tokens before marker, keep tokens after
                    mask.extend([False] * marker_pos)
                    mask.extend([True] * (len(response_tokens) - marker_pos))
                else:
                    # Marker not found, train on all
                    mask.extend([True] * len(response_tokens))
            else:
                # No marker, train on all
                mask.extend([True] * len(response_tokens))

        return mask

    def _find_sublist(self, full_list, sublist):
        """Find position of sublist in full list."""
        sublist_len = len(sublist)
        for i in range(len(full_list) - sublist_len + 1):
            if full_list[i:i+sublist_len] == sublist:
                return i
        return -1


class ConditionalWorker(BaseRolloutWorker):
    def rollout(self, task):
        # Generate response
        result = self._inference_client.completion(task["prompt"])
        response = result["response"]

        # Conditional evaluation based on task type
        task_type = task.get("type", "default")

        if task_type == "exact_match":
            reward = self._exact_match_reward(response, task)
        elif task_type == "contains":
            reward = self._contains_reward(response, task)
        elif task_type == "similarity":
            reward = self._similarity_reward(response, task)
        else:
            reward = 0.0

        trajectory = Trajectory(
            tokens=result["prompt_tokens"] + result["response_tokens"],
            loss_mask=[0] * len(result["prompt_tokens"]) + [1] * len(result["response_tokens"]),
            reward=reward,
            extra_fields={"task_type": task_type}
        )

        return self._put_trajectory(trajectory)

    def _exact_match_reward(self, response, task):
        """Exact match evaluation."""
        return 1.0 if response.strip() == task["answer"].strip() else 0.0

    def _contains_reward(self, response, task):
        """Substring match evaluation."""
        return 1.0 if task["answer"] in response else 0.0

    def _similarity_reward(self, response, task):
        """Similarity-based evaluation."""
        # Implement similarity metric
        from difflib import SequenceMatcher
        ratio = SequenceMatcher(None, response, task["answer"]).ratio()
        return float(ratio)


class MyWorker(BaseRolloutWorker):
    def __init__(self, config):
        super().__init__(config)
        # Load worker-specific config
        self.use_few_shot = config.get("use_few_shot", True)
        self.num_examples = config.get("num_examples", 3)
        self.answer_format = config.get("answer_format", "xml")


# utils.py (in workspace)
import re  # noqa: E402


def extract_xml_tag(text: str, tag: str) -> str | None:
    """Extract content from XML-style tags."""
    pattern = f"<{tag}>(.*?)</{tag}>"
    match = re.search(pattern, text, re.DOTALL)
    return match.group(1).strip() if match else None


class XmlAnswerWorker(BaseRolloutWorker):  # the guide's "MyWorker" of the reusability example
    def _extract_answer(self, response):
        return extract_xml_tag(response, "answer") or response


class LoggingWorker(MySimpleWorker):  # "Monitor Training": the guide's logging call inside a rollout
    def _compute_reward(self, answer, task):
        self._activity_tracker.experiment_logger_post(
            backend="wandb",
            data={
                "custom_metric": float(len(answer)),
                "agent_calls": 1,
            },
            step=task["step"]
        )
        return super()._compute_reward(answer, task)
