"""/v1/messages/count_tokens over a fake Tokenizer with real Jinja templates (the real one runs in
tests/e2e): later system messages stay in place where the template takes them and are folded into the
system prompt where it refuses them; refusals are in Anthropic's error shape."""

from __future__ import annotations

from engine.errors import InvalidRequestError

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from api.body import UnknownFields
from api.error_handlers import install_error_handlers
from deployments.anthropic_routes import AnthropicRoutes

ROUTE = "/v1/messages/count_tokens"
IN_PLACE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
# Like Gemma's and Mistral's templates: a system turn is taken first or not at all.
SYSTEM_FIRST = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System role is only supported first') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}\n{% endfor %}"
)
USER = {"role": "user", "content": "hi"}


def _raise(message: str) -> None:
    raise TemplateError(message)


class FakeTokenizer:
    """Stands in for `tokenizer.chat_prompt_ids.remote(...)`: one id per byte of the rendered text."""

    def __init__(self, template: str):
        env = ImmutableSandboxedEnvironment()
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(template)
        self.chat_prompt_ids = self
        self.num_calls = 0
        self.rendered: list[str] = []

    async def remote(
        self, messages, add_generation_prompt, tools, continue_final_message, template_kwargs=None
    ):
        self.num_calls += 1
        try:
            text = self.template.render(messages=messages)
        except TemplateError as exc:
            return InvalidRequestError(f"the chat template rejected the messages: {exc}", "messages")
        self.rendered.append(text)
        return list(text.encode())


class FakeModel:
    """The resolved model as the routes use it: a name and its Tokenizer handle."""

    def __init__(self, tokenizer: FakeTokenizer):
        self.model_id, self.tokenizer = "m", tokenizer

    async def info(self):
        raise AssertionError("a text-only prompt needs no model info")


def client(template: str) -> tuple[TestClient, FakeTokenizer]:
    tokenizer = FakeTokenizer(template)
    model = FakeModel(tokenizer)
    routes = AnthropicRoutes(lambda _: model, None, UnknownFields())  # type: ignore[arg-type,return-value]
    app = FastAPI()
    install_error_handlers(app)
    app.add_api_route(ROUTE, routes.count_tokens, methods=["POST"])
    return TestClient(app), tokenizer


def count(template: str, **fields) -> tuple[int, FakeTokenizer]:
    http, tokenizer = client(template)
    response = http.post(ROUTE, json={"model": "m", **fields})
    assert response.status_code == 200, response.text
    return response.json()["input_tokens"], tokenizer


MID_SYSTEM = [USER, {"role": "system", "content": "Be terse."}, {"role": "user", "content": "more"}]


def test_a_later_system_message_stays_in_place_where_the_template_takes_it():
    num_tokens, tokenizer = count(IN_PLACE, system="S", messages=MID_SYSTEM)
    expected = "<system>S\n<user>hi\n<system>Be terse.\n<user>more\n"
    assert tokenizer.rendered == [expected] and num_tokens == len(expected)


def test_a_later_system_message_is_folded_where_the_template_refuses_it():
    num_tokens, tokenizer = count(SYSTEM_FIRST, system="S", messages=MID_SYSTEM)
    expected = "<system>S\n\nBe terse.\n<user>hi\n\nmore\n"
    assert tokenizer.num_calls == 2 and tokenizer.rendered == [expected] and num_tokens == len(expected)


def test_a_template_refusal_with_nothing_to_fold_is_one_anthropic_400():
    http, tokenizer = client("{{ raise_exception('Conversation roles must alternate') }}")
    response = http.post(ROUTE, json={"model": "m", "messages": [USER]})
    body = response.json()
    assert response.status_code == 400 and tokenizer.num_calls == 1
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "roles must alternate" in body["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "edits[0].type"),
        ({"thinking": {"type": "enabled"}}, "budget_tokens"),
        ({"output_config": {"effort": "extreme"}}, "effort"),
    ],
)
def test_refused_fields_are_anthropic_400s_naming_them(fields, named):
    http, tokenizer = client(IN_PLACE)
    response = http.post(ROUTE, json={"model": "m", "messages": [USER], **fields})
    body = response.json()
    assert response.status_code == 400 and tokenizer.num_calls == 0
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": body["error"]["message"]},
    }
    assert named in body["error"]["message"]
