"""The guide's listing 001_18 (shared/seeds/001_*.txt, code block 18), as printed; only import lines differ."""

# Test evaluator standalone
from tests.seed_examples.listings.s001_05 import MyEvaluator
from streamrl.api import BaseEvaluationTarget

evaluator = MyEvaluator()
target = BaseEvaluationTarget(final_answer="Test output")
data = {"answer": "Expected"}
result = evaluator.evaluate(data, target)
print(f"Reward: {result.reward}, Metrics: {result.metrics}")
