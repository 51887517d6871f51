"""The guide's listing 001_15 (shared/seeds/001_*.txt, code block 15), as printed; only import lines differ."""
import re
from streamrl.api import EvaluationRunResult, Evaluator

class CodeGenEvaluator(Evaluator):
    """Evaluator for code generation with test execution."""

    def evaluate(self, data, evaluation_target):
        generated_code = self.extract_code(evaluation_target.final_answer)
        test_cases = data.get("test_cases", [])

        # Execute test cases
        passed = 0
        failed = 0
        for test in test_cases:
            if self.run_test(generated_code, test):
                passed += 1
            else:
                failed += 1

        # Reward based on pass rate
        reward = passed / max(len(test_cases), 1)

        return EvaluationRunResult(
            reward=reward,
            metrics={
                "test_pass_rate": reward,
                "tests_passed": float(passed),
                "tests_failed": float(failed),
            }
        )

    def extract_code(self, response: str) -> str:
        """Extract code block from response."""
        match = re.search(r"```python\n(.*?)\n```", response, re.DOTALL)
        return match.group(1) if match else response

    def run_test(self, code: str, test: dict) -> bool:
        """Run a single test case."""
        try:
            # Execute code safely (use sandbox in production)
            exec_globals = {}
            exec(code, exec_globals)

            # Run test
            test_func = exec_globals.get(test["function_name"])
            result = test_func(*test["inputs"])

            return result == test["expected_output"]
        except Exception:
            return False
