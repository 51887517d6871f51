"""The guide's listing 002_07 (shared/seeds/002_*.txt, code block 7), as printed; only import lines differ."""
from streamrl.api import BaseEvaluationTarget
from tests.seed_examples.listings.s002_01 import MyTaskEvaluator

def test_evaluator():
    evaluator = MyTaskEvaluator()

    # Test correct answer
    data = {"answer": "4"}
    target = BaseEvaluationTarget(final_answer="4")
    result = evaluator.evaluate(data, target)
    assert result.reward == 1.0

    # Test incorrect answer
    target = BaseEvaluationTarget(final_answer="5")
    result = evaluator.evaluate(data, target)
    assert result.reward == 0.0
