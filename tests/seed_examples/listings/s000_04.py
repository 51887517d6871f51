"""The guide's listing 000_04 (shared/seeds/000_*.txt, code block 4), as printed; only import lines differ."""
from streamrl.api import BaseRolloutWorker

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
