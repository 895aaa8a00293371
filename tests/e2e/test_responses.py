"""The real app through the official openai SDK's Responses API: create, streams, previous_response_id."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
QUESTION = "Name three colors."
OPENING = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def create(client, **kwargs):
    return client.responses.create(
        **{"model": MODEL, "input": QUESTION, "max_output_tokens": 12, "temperature": 0, **kwargs}
    )


def check_event_order(events) -> str:
    """Asserts the typed event order and numbering; returns the streamed text."""
    types = [e.type for e in events]
    assert types[:4] == OPENING and types[-4:-1] == CLOSING
    assert types[-1] in ("response.completed", "response.incomplete")
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-4].text == streamed == events[-1].response.output_text
    return streamed


def test_create(client):
    response = create(client, instructions="You are terse.")
    assert response.object == "response" and response.id.startswith("resp_") and response.model == MODEL
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    usage = response.usage
    assert usage.input_tokens > 5 and 0 < usage.output_tokens <= 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "You are terse." and response.max_output_tokens == 12


def test_max_output_tokens_reached_is_incomplete(client):
    response = create(client, max_output_tokens=1)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 1


def test_create_stream_event_order(client):
    events = list(create(client, stream=True))
    assert check_event_order(events) == create(client).output_text


def test_stream_helper(client):
    with client.responses.stream(model=MODEL, input=QUESTION, max_output_tokens=12, temperature=0) as stream:
        events = list(stream)
    check_event_order(events)


def test_previous_response_id_continues_the_conversation(client):
    first = create(client, input="My name is Ada.", instructions="Answer briefly.")
    follow_up = create(client, input="What is my name?", previous_response_id=first.id)
    explicit = create(
        client,
        input=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    # Same prompt (instructions are not carried over), so the same greedy answer.
    assert follow_up.usage.input_tokens == explicit.usage.input_tokens > first.usage.input_tokens
    assert follow_up.output_text == explicit.output_text
    assert follow_up.previous_response_id == first.id


def test_unknown_or_unstored_previous_id_is_400(client):
    unstored = create(client, store=False, max_output_tokens=1)
    for response_id in ("resp_unknown", unstored.id):
        with pytest.raises(openai.BadRequestError) as err:
            create(client, previous_response_id=response_id)
        assert err.value.code == "previous_response_not_found" and err.value.param == "previous_response_id"


def test_forcing_a_tool_without_tools_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        create(client, tool_choice="required")
    assert err.value.param == "tool_choice" and "no tools" in err.value.message


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        create(client, model="gpt-5")
    assert err.value.code == "model_not_found"


def test_logprobs_when_included_whole_and_streamed(client):
    asked = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    response = create(client, **asked)
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == response.usage.output_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in logprobs)
    events = list(create(client, stream=True, **asked))
    streamed = [e for d in events if d.type == "response.output_text.delta" for e in d.logprobs]
    final = events[-1].response.output[0].content[0].logprobs
    assert [e.token for e in final] == [e.token for e in logprobs]
    # A last token with no text of its own (end of sequence) is in no delta, only in the final part.
    assert [e.token for e in streamed] == [e.token for e in final][: len(streamed)] and streamed
