"""Engine output batches -> OpenAI objects: text, finish reasons, usage, logprobs, failures."""

from __future__ import annotations

import base64
import struct

from engine.messages import RequestOutput, TokenLogprob

import pytest

from api.errors import ApiError
from api.openai_outputs import (
    ChoiceState,
    ResponseMeta,
    chat_chunk,
    chat_completion,
    chat_usage_chunk,
    completion,
    completion_chunk,
    embedding_list,
    logprob_token_ids,
)

META = ResponseMeta("chatcmpl-1", 1700000000, "smol")
TEXT = {1: "Hel", 2: "lo", 3: "!", 4: "?"}


def out(ids, text, finish=None, **counts) -> RequestOutput:
    return RequestOutput("r", ids, text, finish_reason=finish, **counts)


def test_chat_completion_accumulates_batches_and_usage():
    state = ChoiceState(0, num_prompt_tokens=5)
    state.add([out([1], "Hel"), out([2], "lo", num_prompt_tokens=5, num_output_tokens=2)])
    state.add([out([3], "!", "length", num_prompt_tokens=5, num_output_tokens=3, num_cached_tokens=4)])
    body = chat_completion(META, [state], {}).dump()
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def test_completion_tokens_counted_even_if_engine_counts_are_missing():
    state = ChoiceState(0, num_prompt_tokens=2)
    state.add([out([1, 2], "Hello", "stop")])
    assert chat_completion(META, [state], {}).usage.completion_tokens == 2


def test_first_chat_chunk_has_role_later_ones_only_content():
    state = ChoiceState(0)
    first = chat_chunk(META, 0, state.add([out([1], "Hel")]), True, False, {}).dump()
    later = chat_chunk(META, 0, state.add([out([2], "lo", "stop")]), False, False, {}).dump()
    assert first["object"] == "chat.completion.chunk" and "usage" not in first
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert later["choices"][0]["delta"] == {"content": "lo"}
    assert later["choices"][0]["finish_reason"] == "stop"


def test_empty_batch_makes_no_chunk_unless_first():
    state = ChoiceState(0)
    assert chat_chunk(META, 0, state.add([out([], "")]), True, False, {}) is not None
    assert chat_chunk(META, 0, state.add([out([7], "")]), False, False, {}) is None
    assert completion_chunk(META, 0, state.add([out([7], "")]), False, {}) is None


def test_include_usage_sends_null_usage_then_a_usage_only_chunk():
    state = ChoiceState(0, num_prompt_tokens=3)
    chunk = chat_chunk(META, 0, state.add([out([1], "Hel", "stop", num_output_tokens=1)]), True, True, {})
    assert chunk.dump()["usage"] is None
    final = chat_usage_chunk(META, [state]).dump()
    assert final["choices"] == [] and final["usage"]["total_tokens"] == 4


def test_chat_logprobs_render_token_texts_and_bytes():
    state = ChoiceState(0)
    entry = TokenLogprob(1, -0.5, top=[(1, -0.5), (2, -1.5)])
    delta = state.add([RequestOutput("r", [1], "Hel", logprobs=[entry])])
    assert logprob_token_ids(delta.logprobs) == {1, 2}
    content = chat_chunk(META, 0, delta, True, False, TEXT).dump()["choices"][0]["logprobs"]["content"]
    assert content == [
        {
            "token": "Hel",
            "logprob": -0.5,
            "bytes": list(b"Hel"),
            "top_logprobs": [
                {"token": "Hel", "logprob": -0.5, "bytes": list(b"Hel")},
                {"token": "lo", "logprob": -1.5, "bytes": list(b"lo")},
            ],
        }
    ]


def test_completion_logprobs_have_text_offsets_across_chunks():
    state = ChoiceState(0)
    state.add([RequestOutput("r", [1], "Hel", logprobs=[TokenLogprob(1, -0.1)])])
    delta = state.add(
        [RequestOutput("r", [2, 3], "lo!", logprobs=[TokenLogprob(2, -0.2), TokenLogprob(3, -0.3)])]
    )
    logprobs = completion_chunk(META, 0, delta, False, TEXT).dump()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["lo", "!"] and logprobs["text_offset"] == [3, 5]
    whole = completion(META, [state], TEXT).dump()["choices"][0]["logprobs"]
    assert whole["tokens"] == ["Hel", "lo", "!"] and whole["text_offset"] == [0, 3, 5]


def test_multi_prompt_completion_sums_usage():
    states = [ChoiceState(i, num_prompt_tokens=2) for i in range(2)]
    states[0].add([out([1], "a", "stop")])
    states[1].add([out([2, 3], "bc", "length")])
    body = completion(META, states, {}).dump()
    assert [c["text"] for c in body["choices"]] == ["a", "bc"]
    assert body["usage"]["prompt_tokens"] == 4 and body["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(("finish", "code"), [("error", "request_failed"), ("abort", "request_aborted")])
def test_failed_requests_raise_api_errors(finish, code):
    state = ChoiceState(0)
    with pytest.raises(ApiError) as err:
        state.add([RequestOutput("r", [], "", finish_reason=finish, error="sampler blew up")])
    assert err.value.status == 500 and err.value.code == code


def test_embeddings_float_and_base64():
    floats = embedding_list("mini", [[0.5, -1.0]], 3, None).dump()
    assert floats["data"] == [{"object": "embedding", "index": 0, "embedding": [0.5, -1.0]}]
    assert floats["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    encoded = embedding_list("mini", [[0.5, -1.0]], 3, "base64").dump()["data"][0]["embedding"]
    assert struct.unpack("<2f", base64.b64decode(encoded)) == (0.5, -1.0)
