"""Evaluator built-ins on good, bad and malformed outputs; the code sandbox's limits; the
LLM judge over a real HTTP endpoint speaking the OpenAI chat-completions protocol."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from streamrl.producers.evaluator import BaseEvaluationTarget, run_evaluator
from streamrl.producers.evaluator_builtins import make_evaluator
from streamrl.producers.sandbox import SandboxLimits, run_python
from streamrl.runtime.plugins import LoadError
from tests.conftest import command_lines


def score(spec: str, output: str, kwargs: dict | None = None, **row):
    outcome = run_evaluator(make_evaluator(spec, kwargs), row, BaseEvaluationTarget(output))
    return outcome.result, outcome.error


def test_exact_match():
    assert score("builtin:exact_match", " 42\n", answer="42")[0].reward == 1.0
    assert score("builtin:exact_match", "41", answer="42")[0].reward == 0.0
    assert score("builtin:exact_match", "", answer="42")[0].reward == 0.0
    assert score("builtin:exact_match", "Paris", {"case_sensitive": False}, answer="paris")[0].reward == 1.0


def test_regex_and_tag_extraction():
    good, _ = score("builtin:tag", "I think <answer> 7 </answer>.", answer="7")
    assert good.reward == 1.0 and good.metrics == {"accuracy": 1.0, "format_ok": 1.0}
    bad, _ = score("builtin:tag", "<answer>8</answer>", answer="7")
    assert bad.reward == 0.0 and bad.metrics["format_ok"] == 1.0
    malformed, _ = score("builtin:tag", "<answer>7", answer="7")
    assert malformed.reward == 0.0 and malformed.metrics["format_ok"] == 0.0
    last, _ = score("builtin:regex", "x=1, then x=3", {"pattern": r"x=(\d+)", "last": True}, answer="3")
    assert last.reward == 1.0
    with pytest.raises(Exception, match=r"unterminated|missing"):
        make_evaluator("builtin:regex", {"pattern": "(unclosed"})


def test_fuzzy():
    close, _ = score("builtin:fuzzy", "the quick brown fox", answer="the quick brown fax")
    assert 0.9 < close.reward < 1.0
    far, _ = score("builtin:fuzzy", "zzz", answer="the quick brown fox")
    assert far.reward < 0.2
    assert score("builtin:fuzzy", "the quick brown fax", {"threshold": 0.9}, answer="the quick brown fox")[0].reward == 1.0
    assert score("builtin:fuzzy", "", {"threshold": 0.9}, answer="the quick brown fox")[0].reward == 0.0


def test_math_equivalence():
    assert score("builtin:math", "so the answer is \\boxed{\\frac{1}{2}}", answer="0.5")[0].reward == 1.0
    assert score("builtin:math", "$0.50$", answer="1/2")[0].reward == 1.0
    assert score("builtin:math", "\\boxed{3}", answer="4")[0].reward == 0.0
    malformed, _ = score("builtin:math", "no idea", answer="4")
    assert malformed.reward == 0.0 and malformed.metrics["format_ok"] == 0.0
    broken, error = score("builtin:math", "4", answer="")  # a row without a usable answer
    assert broken.reward == 0.0 and "does not parse as math" in error


def test_weighted_criteria():
    criteria = [{"evaluator": "builtin:tag", "weight": 3}, {"evaluator": "builtin:fuzzy", "weight": 1, "name": "close"}]
    result, _ = score("builtin:weighted", "<answer>7</answer>", {"criteria": criteria}, answer="7")
    assert result.metrics["tag_reward"] == 1.0
    similarity = result.metrics["close_reward"]
    assert result.reward == pytest.approx((3 * 1.0 + similarity) / 4)
    result, _ = score("builtin:weighted", "nothing", {"criteria": criteria}, answer="7")
    assert result.metrics["tag_reward"] == 0.0 and result.reward == pytest.approx(result.metrics["close_reward"] / 4)
    with pytest.raises(LoadError, match="no built-in evaluator 'nope'"):
        make_evaluator("builtin:weighted", {"criteria": [{"evaluator": "builtin:nope"}]})


def test_code_execution_passes_fails_and_rejects_malformed():
    tests = [{"stdin": "3 4\n", "stdout": "7"}, {"stdin": "10 -2\n", "stdout": "8"}]
    good = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    result, _ = score("builtin:code", good, tests=tests)
    assert result.reward == 1.0 and result.metrics["pass_rate"] == 1.0
    half = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n```"
    assert score("builtin:code", half, tests=tests)[0].reward == 0.5
    asserts = "```python\ndef add(a, b):\n    return a + b\n```"
    assert score("builtin:code", asserts, tests="assert add(2, 2) == 4")[0].reward == 1.0
    assert score("builtin:code", asserts, tests="assert add(2, 2) == 5")[0].reward == 0.0
    malformed, _ = score("builtin:code", "print(1) with no code block", tests=tests)
    assert malformed.reward == 0.0 and malformed.metrics["format_ok"] == 0.0


def nobody_processes() -> int:
    return sum(1 for args in command_lines().values() if any(arg.endswith("program.py") for arg in args))


@pytest.mark.parametrize(
    "program, status",
    [
        ("while True:\n    pass", "timeout"),
        ("import time\ntime.sleep(600)", "timeout"),
        ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "timeout"),
        ("x = bytearray(4 * 1024 ** 3)", "out of memory"),
    ],
)
def test_the_sandbox_stops_a_runaway_program_within_its_limit(program, status):
    limits = SandboxLimits(wall_seconds=2.0, cpu_seconds=2, memory_mb=256, max_processes=8)
    started = time.monotonic()
    result = run_python(program, limits=limits)
    assert result.status == status
    assert time.monotonic() - started < limits.wall_seconds + 3
    assert wait_until(lambda: nobody_processes() == 0, 5), "processes of the program were left running"
    # and the next program runs normally
    after = run_python("print(6 * 7)", limits=limits)
    assert after.ok and after.stdout.strip() == "42"


def test_a_hanging_solution_costs_its_limit_and_evaluation_goes_on():
    evaluator = make_evaluator("builtin:code", {"wall_seconds": 1.5, "cpu_seconds": 2})
    tests = [{"stdin": "", "stdout": "1"}]
    started = time.monotonic()
    hung = run_evaluator(evaluator, {"tests": tests}, BaseEvaluationTarget("```python\nwhile True: pass\n```"))
    assert hung.error is None and hung.result.reward == 0.0 and hung.result.metrics["timeouts"] == 1.0
    assert time.monotonic() - started < 5
    fine = run_evaluator(evaluator, {"tests": tests}, BaseEvaluationTarget("```python\nprint(1)\n```"))
    assert fine.result.reward == 1.0


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


class JudgeHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat-completions endpoint whose judge grades by a rule: the
    response contains the reference answer -> 9, else 2; "ramble" -> no score line."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        reference = prompt.split("Reference answer: ")[1].split("\n")[0]
        response = prompt.split("Response: ")[1].split("\n")[0]
        if "ramble" in response:
            content = "Hard to say."
        else:
            content = f"Reason: compared.\nSCORE: {9 if reference in response else 2}"
        payload = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), JudgeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_llm_judge_over_an_openai_compatible_endpoint(judge_url):
    kwargs = {"base_url": judge_url, "model": "judge", "max_score": 10}
    good, _ = score("builtin:llm_judge", "It is Paris.", kwargs, prompt="Capital of France?", answer="Paris")
    assert good.reward == pytest.approx(0.9) and good.metrics["judge_score"] == 9
    bad, _ = score("builtin:llm_judge", "It is Rome.", kwargs, prompt="Capital of France?", answer="Paris")
    assert bad.reward == pytest.approx(0.2)
    malformed, _ = score("builtin:llm_judge", "ramble", kwargs, prompt="q", answer="Paris")
    assert malformed.reward == 0.0 and malformed.metrics["judge_format_ok"] == 0.0


def test_an_unreachable_judge_is_a_recorded_error_not_a_crash():
    evaluator = make_evaluator(
        "builtin:llm_judge", {"base_url": "http://127.0.0.1:9/v1", "model": "judge", "timeout_s": 2, "max_retries": 0}
    )
    outcome = run_evaluator(evaluator, {"prompt": "q", "answer": "a"}, BaseEvaluationTarget("a"))
    assert outcome.result.reward == 0.0 and "APIConnectionError" in outcome.error


def test_unknown_builtin_and_bad_kwargs_are_named():
    with pytest.raises(LoadError, match="no built-in evaluator 'exact'"):
        make_evaluator("builtin:exact")
    with pytest.raises(LoadError, match="evaluator_kwargs do not fit FuzzyMatch"):
        make_evaluator("builtin:fuzzy", {"treshold": 0.5})


def test_the_sandbox_runs_as_an_unprivileged_user_when_root():
    result = run_python("import os\nprint(os.getuid())")
    assert result.ok
    assert int(result.stdout) == (65534 if os.geteuid() == 0 else os.geteuid())


def test_math_from_eight_threads_at_once_gives_the_hand_computed_rewards():
    """math-verify's own time limit uses signal.alarm, which raises off the main thread
    (every reward was 0 there); graded in child processes, each answer gets its reward."""
    from concurrent.futures import ThreadPoolExecutor

    from streamrl.producers.evaluator import BaseEvaluationTarget
    from streamrl.producers.evaluator_builtins import make_evaluator

    cases = [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("$0.50$", "1/2", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("\\boxed{12}", "12", 1.0),
        ("x = 7", "7", 1.0),
        ("\\boxed{0.25}", "1/4", 1.0),
        ("\\boxed{-1}", "1", 0.0),
        ("\\boxed{\\sqrt{4}}", "2", 1.0),
    ]
    evaluator = make_evaluator("builtin:math", {})
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda case: evaluator.evaluate({"answer": case[1]}, BaseEvaluationTarget(case[0])), cases))
    assert [r.reward for r in results] == [expected for _, _, expected in cases]


def test_a_call_past_its_time_limit_is_an_error_and_the_next_call_works():
    import time

    from streamrl.producers.child_pool import ChildPool

    pool = ChildPool(time.sleep, size=1, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=re.escape("took more than 0.5 s")):
        pool(30)
    assert time.monotonic() - started < 10
    assert pool(0) is None  # a new child


def test_an_evaluator_may_return_verls_forms_and_a_bad_metric_costs_only_itself():
    """verl's compute_score returns a float (or a bool), or a dict with `score` and further
    metrics: both are rewards. A metric that is not a number is refused by name (kept in
    extra_info) and the reward stays."""
    from streamrl.producers.evaluator import EvaluationRunResult, Evaluator

    class Returns(Evaluator):
        def __init__(self, value):
            self.value = value

        def evaluate(self, data, evaluation_target):
            return self.value

    target = BaseEvaluationTarget("x")
    assert run_evaluator(Returns(0.75), {}, target).result.reward == 0.75
    assert run_evaluator(Returns(True), {}, target).result.reward == 1.0
    verl = run_evaluator(Returns({"score": 1.0, "acc": True, "pred": "72"}), {}, target)
    assert verl.error is None and verl.result.reward == 1.0
    assert verl.result.metrics == {"acc": 1.0, "pred": 72.0}
    mixed = run_evaluator(Returns(EvaluationRunResult(reward=0.5, metrics={"ok": 1, "why": "too long", "n": None})), {}, target)
    assert mixed.error is None and mixed.result.reward == 0.5 and mixed.result.metrics == {"ok": 1.0}
    assert mixed.result.extra_info["refused_metrics"] == {"why": "not a number: 'too long'", "n": "not a number: None"}
    wrong = run_evaluator(Returns(["a list"]), {}, target)
    assert wrong.result.reward == 0.0 and "returned list, expected an EvaluationRunResult, a number or a mapping" in wrong.error
