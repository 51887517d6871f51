"""The guide's worker types and patterns (recipes/patterns/workers.py) on the real
embedded engine: what each builds, which tokens train, and that every trained token
carries the behaviour logprob it was sampled with."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from streamrl.producers.evaluator import ExactMatchEvaluator
from streamrl.producers.inference import BatchingEngine, EmbeddedEngine, SamplingParams
from streamrl.producers.rollout import InferenceClient
from streamrl.recipes.patterns import workers
from streamrl.runtime.chat_template import encode
from streamrl.runtime.tiny_lm import build_tiny_model
from streamrl.schema.events import Task, unpack_float32, unpack_int32, unpack_mask


def chatml_user(client, text: str) -> list[int]:
    """A custom worker's prompt text, as the built-in model's ChatML template sends it: one user turn."""
    return encode(client.tokenizer, f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("patterns") / "model", max_positions=512)
    engine = BatchingEngine(EmbeddedEngine(model, seed=5))
    yield InferenceClient(engine, SamplingParams(max_new_tokens=8, temperature=1.0))
    engine.close()


def run(worker_cls, client, config=None, **data):
    worker = worker_cls({"temperature": 1.0, **(config or {})}, client, ExactMatchEvaluator(), lambda e: None)
    row = {"prompt": "2+3", "answer": "5", **data}
    trajectory, evaluation = worker.run_task(Task(run_id="p", task_id="t", group_id="g", prompt=row["prompt"], data=row))
    return trajectory, evaluation, client.recorded()


def trained(trajectory):
    tokens, mask = unpack_int32(trajectory.tokens), unpack_mask(trajectory.loss_mask).astype(bool)
    return tokens[mask].tolist(), unpack_float32(trajectory.logprobs)[mask]


def test_simple_worker_and_missing_field(client):
    trajectory, _, completions = run(workers.SimpleQAWorker, client, question="2+3")
    assert trained(trajectory)[0] == completions[0].response_token_ids
    failed, evaluation, _ = run(workers.SimpleQAWorker, client)  # no "question"
    assert failed.error == "rollout returned 'fail'" and evaluation.reward == 0.0


def test_multi_step_worker_trains_only_the_answer_in_the_context_it_was_sampled_in(client):
    trajectory, _, completions = run(workers.MultiStepWorker, client, {"reasoning_tokens": 6, "answer_tokens": 4})
    reasoning, answer = completions
    tokens = unpack_int32(trajectory.tokens).tolist()
    assert tokens == answer.prompt_token_ids + answer.response_token_ids
    assert (
        tokens[: len(reasoning.prompt_token_ids) + len(reasoning.response_token_ids)]
        == reasoning.prompt_token_ids + reasoning.response_token_ids
    )
    ids, logprobs = trained(trajectory)
    assert ids == answer.response_token_ids
    np.testing.assert_allclose(logprobs, answer.logprobs, rtol=1e-6)
    assert trajectory.extra_fields["reasoning"] == reasoning.response_text


def test_few_shot_template(client):
    config = {"system_prompt": "Add.", "few_shot": [{"question": "1+1", "answer": "2"}]}
    _, _, completions = run(workers.FewShotTemplateWorker, client, config)
    assert completions[0].prompt_token_ids == chatml_user(client, "Add.\nQ: 1+1\nA: 2\nQ: 2+3\nA:")


def test_external_api_context(client):
    class Api(BaseHTTPRequestHandler):
        def do_GET(self):
            data = json.dumps({"context": "five is 5"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        trajectory, _, completions = run(
            workers.ExternalContextWorker, client, {"api_url": f"http://127.0.0.1:{server.server_address[1]}/ctx"}
        )
    finally:
        server.shutdown()
    expected = chatml_user(client, "Context: five is 5\nQ: 2+3\nA:")
    assert completions[0].prompt_token_ids == expected
    assert trajectory.extra_fields["context"] == "five is 5"
    down, evaluation, _ = run(workers.ExternalContextWorker, client, {"api_url": "http://127.0.0.1:9/ctx", "api_timeout_s": 1})
    assert "URLError" in down.error and evaluation.reward == 0.0  # recorded, not lost


def test_marker_mask_trains_only_after_the_marker(client):
    worker = workers.MarkerMaskWorker({"marker": "="}, client, ExactMatchEvaluator(), lambda e: None)
    tok = client.tokenizer
    response = tok("12=34", add_special_tokens=False)["input_ids"]
    assert worker.get_train_loss_mask([{"response_tokens": response}]) == [0, 0, 0, 1, 1]
    no_marker = tok("34", add_special_tokens=False)["input_ids"]
    assert worker.get_train_loss_mask([{"response_tokens": no_marker}, {"response_tokens": response}]) == [1, 1, 0, 0, 0, 1, 1]
    trajectory, _, completions = run(workers.MarkerMaskWorker, client, {"marker": "="})
    assert set(trained(trajectory)[0]) <= set(completions[0].response_token_ids)


def test_conditional_evaluation_routes_by_task_type(client):
    for kind in ("exact", "contains", "similarity", "unknown"):
        trajectory, evaluation, completions = run(workers.ConditionalEvalWorker, client, type=kind)
        response = completions[0].response_text
        expected = {"exact": float(response.strip() == "5"), "contains": float("5" in response), "unknown": 0.0}.get(kind)
        assert trajectory.extra_fields["task_type"] == kind
        if expected is not None:
            assert evaluation.reward == expected
        else:
            assert 0.0 <= evaluation.reward <= 1.0


def test_the_guides_task_name_is_recorded_with_every_rollout(client):
    trajectory, _, _ = run(workers.SimpleQAWorker, client, {"task_name": "my_task"}, question="2+3")
    assert trajectory.extra_fields["task_name"] == "my_task"
    failed, _, _ = run(workers.SimpleQAWorker, client, {"task_name": "my_task"})  # a failed rollout too
    assert failed.extra_fields["task_name"] == "my_task"
