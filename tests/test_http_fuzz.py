"""Schema-driven fuzzing (schemathesis) of StreamRL's two HTTP APIs, from their own
OpenAPI documents: the run browser over a real ledger, and `streamrl serve-training`
over a real PostgreSQL with a valid API key, every request body included (the service's
document declares them: the client's own types). Whatever a client sends, the answer
is never a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from streamrl.runtime.tiny_lm import build_tiny_model
from tests.conftest import free_port, fresh_database, run_cli, start_serve_training

EXAMPLES = 25
LOOPBACK = {"host": "127.0.0.1"}  # the browser answers only its own names
# forward_backward's body is the API's protobuf: sent as generated, bytes (the service must
# refuse what does not parse with a 400)
schemathesis.serializer.alias("application/x-protobuf", "application/octet-stream")


def fuzz(schema, call) -> list[str]:
    """Every operation of `schema`, EXAMPLES generated cases each; the 5xx answers."""
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            response = call(case)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query or ''}: {response.status_code} {response.text[:200]}"
                )

        check()
    return failures


def test_the_run_browser_never_answers_5xx(stack):
    from streamrl.ui.app import make_app

    app = make_app(stack.readonly_database_url)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=LOOPBACK)
    assert fuzz(schema, lambda case: case.call(headers=LOOPBACK)) == []


@pytest.fixture(scope="module")
def training_service(stack, tmp_path_factory):
    """The service on a ledger of its own; yields its URL and that ledger's environment."""
    port = free_port()
    model = build_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny")
    env = {"STREAMRL_DATABASE_URL": fresh_database(stack, "fuzz")}
    process = start_serve_training("--model", f"tiny={model}", port=port, env=env)
    yield f"http://127.0.0.1:{port}", env
    process.kill()
    process.wait()


def test_the_training_service_never_answers_5xx(training_service):
    url, env = training_service
    key = run_cli("training-key", "create", "fuzz", env=env, check=True).stdout.split()[1]
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    headers = {"X-API-Key": key}
    assert fuzz(schema, lambda case: case.call(base_url=url, headers=headers, timeout=30)) == []
