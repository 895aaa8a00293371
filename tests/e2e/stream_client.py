"""A streaming chat client for the fault and disconnect tests: how one SSE stream ended, with a deadline.

Outcomes: `completed` (a finish_reason, then `[DONE]`), `error_event:<code>` (an error event, then the
stream closed), `http_<status>` (refused before the stream), `broken` (the connection dropped without either),
`hung` (nothing for `read_timeout_s`).
"""

from __future__ import annotations

import json

import httpx

MODEL = "smol-e2e"


def long_chat(text: str, max_tokens: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def stream_outcome(client: httpx.AsyncClient, body: dict) -> str:
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return f"http_{response.status_code}"
            return await _read(response)
    except httpx.TimeoutException:
        return "hung"
    except httpx.HTTPError:
        return "broken"


async def _read(response: httpx.Response) -> str:
    finish_reason, error_code = None, None
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            error_code = event["error"].get("code") or event["error"].get("type")
            continue
        choice = (event.get("choices") or [{}])[0]
        finish_reason = choice.get("finish_reason") or finish_reason
    if error_code is not None:
        return f"error_event:{error_code}"
    return "completed" if finish_reason else "broken"
