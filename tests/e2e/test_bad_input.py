"""Hand-written bad input on every generating route: always a 4xx in the route's dialect, never a 5xx.

Complements tests/e2e/test_fuzz.py (schemathesis over /openapi.json) with what a schema fuzzer does
not send: bodies over the size limit, 100k-deep JSON, invalid UTF-8, a 100k-token prompt, images that
are not images (the bundled model reads no images). After the whole table the server still answers.
"""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
HUGE_PROMPT = "hello " * 100_000  # ~100k tokens: far past max_model_len 1024
NOT_AN_IMAGE = "data:image/png;base64," + "bm90IGFuIGltYWdl"  # "not an image"
FILE_URL = "file:///etc/passwd"  # never read: refused (and this model reads no images anyway)

# One normal body per route; the cases below replace or break parts of it.
ROUTES = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
    },
    "/v1/completions": {"model": MODEL, "prompt": "Hi", "max_tokens": 2},
    "/v1/embeddings": {"model": "default", "input": "Hi"},
    "/v1/responses": {"model": MODEL, "input": "Hi", "max_output_tokens": 16},
    "/v1/messages": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
}
PROMPT_FIELD = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/responses": "input",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages",
}
BUDGET_FIELD = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
    "/v1/messages": "max_tokens",
}


def _with_prompt(path: str, value_for_chat, value_for_text) -> dict:
    field = PROMPT_FIELD[path]
    value = value_for_chat if field == "messages" else value_for_text
    return {**ROUTES[path], field: value}


def raw_cases(path: str) -> dict[str, bytes]:
    """Bodies that are not valid JSON documents of the route's schema, as bytes."""
    good = json.dumps(ROUTES[path]).encode()
    return {
        "deep_json": b'{"model": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "invalid_utf8": good.replace(b'"Hi"', b'"\xff\xfe\xc3("', 1),
        "not_an_object": b"[1, 2, 3]",
        "truncated": good[: len(good) // 2],
        "empty": b"",
    }


def json_cases(path: str) -> dict[str, dict]:
    user = {"role": "user", "content": "Hi"}
    cases = {
        "empty_prompt": _with_prompt(path, [], ""),
        "wrong_role": _with_prompt(
            path, [{"role": "robot", "content": "Hi"}], [{"role": "robot", "content": "Hi"}]
        ),
        "huge_prompt": _with_prompt(path, [{"role": "user", "content": HUGE_PROMPT}], HUGE_PROMPT),
        "unknown_nested_field": _with_prompt(
            path, [{**user, "frobnicate": True}], [{**user, "frobnicate": True}]
        ),
        "model_is_a_number": {**ROUTES[path], "model": 7},
        "content_is_an_object": _with_prompt(path, [{"role": "user", "content": {"a": 1}}], {"a": 1}),
        "not_an_image": _with_prompt(path, [_image_message(path)], [_image_message(path)]),
        "file_url_image": _with_prompt(
            path, [_image_message(path, FILE_URL)], [_image_message(path, FILE_URL)]
        ),
        "local_path_image": _with_prompt(
            path, [_image_message(path, "/etc/hostname")], [_image_message(path, "/etc/hostname")]
        ),
        "ids_outside_vocab": _with_prompt(path, [user], [10**9]),
    }
    if path in BUDGET_FIELD:
        cases["budget_zero"] = {**ROUTES[path], BUDGET_FIELD[path]: 0}
        cases["budget_negative"] = {**ROUTES[path], BUDGET_FIELD[path]: -5}
        cases["budget_huge"] = {**ROUTES[path], BUDGET_FIELD[path]: 10**12}
    if path == "/v1/responses":
        cases["empty_prompt"] = {**ROUTES[path], "input": []}  # "" is a valid (empty) user turn there
    if path == "/v1/messages":
        del cases["budget_huge"]  # capped to the context the prompt leaves, by design (not an error)
    if path == "/v1/messages/count_tokens":
        del cases["huge_prompt"]  # counting a long prompt is this route's job: see the test below
    if path != "/v1/completions":
        del cases["ids_outside_vocab"]  # only /v1/completions takes token ids as a prompt
    return cases


def _image_message(path: str, url: str = NOT_AN_IMAGE) -> dict:
    if path.startswith("/v1/messages"):
        if url == NOT_AN_IMAGE:
            source = {"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}
        else:
            source = {"type": "url", "url": url}
        return {"role": "user", "content": [{"type": "image", "source": source}]}
    if path == "/v1/responses":
        return {"role": "user", "content": [{"type": "input_image", "image_url": url}]}
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}


CASES = [(path, name, "raw") for path in ROUTES for name in raw_cases(path)] + [
    (path, name, "json") for path in ROUTES for name in json_cases(path)
]


@pytest.mark.parametrize(("path", "name", "kind"), CASES)
def test_bad_input_is_a_4xx_in_the_dialect(http, path, name, kind):
    headers = {"content-type": "application/json"}
    if kind == "raw":
        response = http.post(path, content=raw_cases(path)[name], headers=headers)
    else:
        response = http.post(path, json=json_cases(path)[name])
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:400])
    assert_dialect_error(path, response.json())
    assert "root:" not in response.text  # no local file's content ever comes back


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_body_over_the_size_limit_is_413_and_nothing_else_breaks(http, path):
    body = json.dumps({**ROUTES[path], "pad": "x" * (11 * 1024 * 1024)}).encode()  # limit: 10 MiB
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text[:300]
    assert_dialect_error(path, response.json())


def test_a_100k_token_prompt_is_counted_and_refused_for_generation(http):
    messages = [{"role": "user", "content": HUGE_PROMPT}]
    counted = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": messages})
    assert counted.status_code == 200 and counted.json()["input_tokens"] >= 100_000
    refused = http.post("/v1/messages", json={"model": MODEL, "messages": messages, "max_tokens": 2})
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"


def test_an_unknown_top_level_field_is_accepted_on_every_route(http):
    """docs/compatibility.md: the APIs add fields weekly; an unknown one is logged once, not refused
    (the e2e app runs the default `strict_request_fields: false`; tests/api/test_errors.py covers true)."""
    for path, body in ROUTES.items():
        response = http.post(path, json={**body, "frobnicate_2026": {"any": "value"}})
        assert response.status_code == 200, (path, response.text[:300])


def test_the_server_still_answers_every_route_after_the_table(http):
    for path, body in ROUTES.items():
        response = http.post(path, json=body)
        assert response.status_code == 200, (path, response.text[:300])


def test_a_streamed_request_with_bad_input_is_refused_before_the_stream(http):
    body = {**ROUTES["/v1/chat/completions"], "stream": True, "max_tokens": -1}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 400
        assert response.headers["content-type"].startswith("application/json")


def assert_dialect_error(path: str, body: dict) -> None:
    if path.startswith("/v1/messages"):
        assert body.keys() == {"type", "error"} and body["type"] == "error", body
        assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["message"], str), body
    else:
        assert body.keys() == {"error"}, body
        assert {"message", "type", "param", "code"} <= body["error"].keys(), body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body


@pytest.fixture(scope="module", autouse=True)
def _server_is_up_before_and_after(http: httpx.Client):
    health = http.get("/health")
    assert health.status_code == 200, health.text
    yield
    health = http.get("/health")
    assert health.status_code == 200, health.text
