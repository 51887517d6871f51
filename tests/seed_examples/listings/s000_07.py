"""The guide's listing 000_07 (shared/seeds/000_*.txt, code block 7), as printed; only import lines differ."""
from streamrl.api import BaseRolloutWorker, Trajectory

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
