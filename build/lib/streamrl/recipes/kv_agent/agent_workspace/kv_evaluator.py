"""The recipe's evaluator: full reward for the right value, partial credit for an
episode whose tool call worked (a well-formed call on an existing key) but whose answer
is wrong. The partial credit gives a young policy's groups reward variance to learn
from before it ever answers right; `accuracy` counts only right answers."""

from streamrl.api import EvaluationRunResult, Evaluator

TOOL_CREDIT = 0.3


class KeyValueEvaluator(Evaluator):
    def evaluate(self, data, evaluation_target):
        correct = evaluation_target.final_answer.strip() == str(data["answer"])
        tool_ok = any(m["role"] == "tool" and not m["content"].startswith("error") for m in evaluation_target.observation or [])
        reward = 1.0 if correct else TOOL_CREDIT * tool_ok
        return EvaluationRunResult(
            reward=reward, ground_truth=data["answer"], metrics={"accuracy": float(correct), "tool_ok": float(tool_ok)}
        )
