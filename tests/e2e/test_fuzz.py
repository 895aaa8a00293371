"""Schemathesis against the running app, from its own /openapi.json: valid and invalid bodies on every
route. No 5xx, and every error in its route's dialect (OpenAI's shape, Anthropic's under /v1/messages).

A hook points `model` at the served one and keeps generation short: it caps every token budget at MAX_TOKENS (and sets one where a missing
or null budget means "up to the context"), and each operation gets few examples, unshrunk. Hypothesis drives
schemathesis' strategies directly: its pytest plugin reads `request.node._nodeid`, gone in pytest 9.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

pytestmark = pytest.mark.e2e

MAX_TOKENS = 2
MAX_EXAMPLES = 30
OPERATIONS = [
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
    ("GET", "/v1/status"),
    ("GET", "/metrics"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
]
_BUDGETS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_GENERATING = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
}


@pytest.fixture(scope="session")
def api_schema(base_url: str):
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    schema.config.update(base_url=base_url)

    @schema.hook
    def map_body(context: schemathesis.HookContext, body: Any) -> Any:
        return bounded(context.operation.path, body)

    @schema.hook
    def map_path_parameters(context: schemathesis.HookContext, parameters: dict[str, Any] | None) -> Any:
        # Random names are all a 404; every other draw names a served model, so some cases reach a 200.
        if parameters and isinstance(name := parameters.get("model"), str):
            parameters["model"] = [name, "default", name, "all-MiniLM-L6-v2"][len(name) % 4]
        return parameters

    return schema


def bounded(path: str, body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("model"), str):
        body["model"] = "default"  # random names only ever reach the 404 model_not_found check
    for name in _BUDGETS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[name] = MAX_TOKENS
    if path in _GENERATING and body.get(_GENERATING[path]) is None:
        body[_GENERATING[path]] = MAX_TOKENS  # an explicit null is as unbounded as a missing budget
    return body


def test_the_schema_lists_exactly_the_fuzzed_operations(api_schema):
    listed = {(op.method.upper(), op.path) for op in (r.ok() for r in api_schema.get_all_operations())}
    assert listed == set(OPERATIONS)


CASES = [(method, path, "positive") for method, path in OPERATIONS] + [
    (method, path, "negative")
    for method, path in OPERATIONS
    if method == "POST"  # GETs take no input
]


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_no_server_error_and_errors_in_the_dialect(api_schema, method, path, mode):
    operation = api_schema[path][method]
    strategy = operation.as_strategy(
        generation_mode=schemathesis.GenerationMode(mode), hooks=api_schema.hooks
    )
    statuses: list[int] = []
    accepted_invalid: list[tuple[int, Any]] = []  # named in the failure, since hypothesis' draws vary

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=True,
    )
    def check(case):
        response = case.call(timeout=60)
        statuses.append(response.status_code)
        if mode == "negative" and not 400 <= response.status_code < 500:
            accepted_invalid.append((response.status_code, case.body))
        assert response.status_code < 500, (response.status_code, response.text[:500])
        if response.status_code >= 400:
            assert_dialect_error(path, response.json())

    check()
    # The cases must reach the routes' own logic: invalid bodies are all refused, valid ones served.
    if mode == "negative":
        assert statuses and not accepted_invalid, accepted_invalid
    else:
        assert any(200 <= status < 300 for status in statuses), statuses


def assert_dialect_error(path: str, body: dict) -> None:
    if path.startswith("/v1/messages"):
        assert body.keys() == {"type", "error"} and body["type"] == "error", body
        assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["message"], str), body
    else:
        assert body.keys() == {"error"}, body
        assert {"message", "type", "param", "code"} <= body["error"].keys(), body
