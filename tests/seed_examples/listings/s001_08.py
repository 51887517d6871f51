"""The guide's listing 001_08 (shared/seeds/001_*.txt, code block 8), as printed; only import lines differ."""
from streamrl.api import EvaluationRunResult, Evaluator

import openai

class LLMJudgeEvaluator(Evaluator):
    """Use an LLM to evaluate output quality."""

    def __init__(self):
        super().__init__()
        self.judge_client = openai.OpenAI()
        self.judge_model = "gpt-4"

    def evaluate(self, data, evaluation_target):
        output = evaluation_target.final_answer
        question = data.get("question", "")
        reference = data.get("reference_answer", "")

        # Create evaluation prompt
        prompt = f"""Evaluate the following answer on a scale of 0-1.

Question: {question}

Reference Answer: {reference}

Student Answer: {output}

Provide a score from 0 to 1, where:
- 0: Completely incorrect
- 0.5: Partially correct
- 1: Fully correct

Output only the numeric score."""

        # Query judge model
        response = self.judge_client.chat.completions.create(
            model=self.judge_model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0
        )

        # Parse score
        try:
            score_text = response.choices[0].message.content.strip()
            reward = float(score_text)
            reward = max(0.0, min(1.0, reward))  # Clamp to [0, 1]
        except (ValueError, AttributeError):
            reward = 0.0

        return EvaluationRunResult(
            reward=reward,
            ground_truth=reference,
            metrics={"llm_judge_score": reward}
        )
