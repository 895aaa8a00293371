"""api/sse.py: each frame's JSON stays on one line for every SSE line reader, UTF-8 kept."""

from __future__ import annotations

import json

import httpx

from api.sse import event, named_event

# Characters JSON may leave raw in a string that str.splitlines (and httpx's aiter_lines) break at.
TEXT = "one\u2028two\x85three\u2029four, né 中"


def _lines(wire: str) -> list[str]:
    decoder = httpx._decoders.LineDecoder()
    return [line for line in decoder.decode(wire) + decoder.flush() if line]


def test_an_event_is_one_data_line_for_a_splitlines_reader_and_decodes_to_the_same_text():
    lines = _lines(event({"content": TEXT}))
    assert len(lines) == 1 and lines[0].startswith("data: ")
    assert json.loads(lines[0][len("data: ") :]) == {"content": TEXT}
    assert "né 中" in lines[0]  # UTF-8 is sent as it is, not as \\u escapes


def test_a_named_event_keeps_its_two_lines():
    lines = _lines(named_event("content_block_delta", {"text": TEXT}))
    assert lines[0] == "event: content_block_delta"
    assert len(lines) == 2 and json.loads(lines[1][len("data: ") :]) == {"text": TEXT}
