"""Every top-level row of docs/compatibility.md with an example, checked against the converters.

For each row the example's fields are added to a minimal request of the row's dialect, which then runs
through what a route does before tokenizing (parse, checks, neutral prompt, sampling params, tool
choice). The row's treatment must hold:
- **no-op**: accepted, and the neutral request is exactly the one without the field;
- **honoured** / **mapped**: accepted, and the neutral request differs (the field reached it);
- **rejected**: a 400 that names the field.
Rows without an example (`-`) act in the route, not the converters; tests/e2e cover them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from api import anthropic_convert, openai_convert, responses_convert
from api.anthropic_schemas import MessagesRequest
from api.errors import ApiError
from api.openai_schemas import ChatCompletionRequest, CompletionRequest
from api.openai_tools import tool_choice as chat_tool_choice
from api.responses_schemas import ResponsesRequest
from api.responses_tools import tool_choice as responses_tool_choice

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
TREATMENTS = ("honoured", "mapped", "no-op", "rejected")


def chat(body: dict[str, Any]) -> tuple:
    req = ChatCompletionRequest.model_validate(body)
    openai_convert.check_chat_supported(req)
    choice = chat_tool_choice(req.tools, req.tool_choice, req.parallel_tool_calls)
    return (
        openai_convert.chat_prompt(req, choice),
        openai_convert.chat_sampling_params(req),
        choice,
        req.stream,
        openai_convert.include_usage(req),
        openai_convert.samples_per_prompt(req),
    )


def completion(body: dict[str, Any]) -> tuple:
    req = CompletionRequest.model_validate(body)
    openai_convert.check_completion_supported(req)
    return openai_convert.completion_prompts(req), openai_convert.completion_sampling_params(req), req.stream


def responses(body: dict[str, Any]) -> tuple:
    req = ResponsesRequest.model_validate(body)
    responses_convert.check_supported(req)
    turns = responses_convert.input_turns(req)
    return (
        responses_convert.chat_prompt(req, turns),
        responses_convert.sampling_params(req),
        responses_tool_choice(req),
        req.stream,
    )


def anthropic(body: dict[str, Any]) -> tuple:
    req = MessagesRequest.model_validate(body)
    anthropic_convert.check_supported(req)
    return (
        anthropic_convert.chat_prompt(req),
        anthropic_convert.sampling_params(req),
        anthropic_convert.tool_choice(req),
        req.stream,
    )


USER = {"role": "user", "content": "hi"}
DIALECTS: dict[str, tuple[Callable[[dict[str, Any]], tuple], dict[str, Any]]] = {
    "OpenAI Chat Completions": (chat, {"model": "m", "messages": [USER]}),
    "OpenAI Completions": (completion, {"model": "m", "prompt": "hi"}),
    "OpenAI Responses": (responses, {"model": "m", "input": "hi"}),
    "Anthropic Messages": (anthropic, {"model": "m", "max_tokens": 16, "messages": [USER]}),
}


def doc_rows() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(dialect, field, treatment, example) for every table row with an example."""
    rows, dialect, columns = [], None, None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            dialect = next((name for name in DIALECTS if line[3:].startswith(name)), None)
            columns = None
        elif line.startswith("| field |"):
            columns = [cell.strip() for cell in line.strip("|").split("|")]
        elif dialect and columns and "example" in columns and line.startswith("| ") and "---" not in line:
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            row = dict(zip(columns, cells, strict=False))
            if row["example"] not in ("-", ""):
                example = json.loads(row["example"].strip("`"))
                rows.append((dialect, row["field"].strip("`"), row["treatment"], example))
    return rows


ROWS = doc_rows()


def test_the_doc_has_rows_for_every_dialect():
    assert {dialect for dialect, *_ in ROWS} == set(DIALECTS)
    assert all(treatment in TREATMENTS for _, _, treatment, _ in ROWS), ROWS


@pytest.mark.parametrize(
    ("dialect", "field", "treatment", "example"), ROWS, ids=[f"{d}:{f}" for d, f, *_ in ROWS]
)
def test_row(dialect, field, treatment, example):
    convert, base = DIALECTS[dialect]
    name = field if field in example else next(iter(example))  # "(unknown top-level field)" rows
    without = base | {k: v for k, v in example.items() if k != name}
    if treatment == "rejected":
        with pytest.raises(ApiError) as info:
            convert(base | example)
        assert info.value.status == 400 and (info.value.param or "").startswith(name), info.value.message
        return
    reference, converted = convert(without), convert(base | example)
    if treatment == "no-op":
        assert converted == reference, f"{field} changed the request the engine gets"
    else:
        assert converted != reference, f"{field} did not reach the request the engine gets"
