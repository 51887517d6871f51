"""The guide's listing 000_05 (shared/seeds/000_*.txt, code block 5), as printed; only import lines differ."""
from streamrl.api import BaseRolloutWorker

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
