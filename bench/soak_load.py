"""The soak's clients: streaming OpenAI chat requests of mixed lengths, some cut off mid-stream.

Owns the request mix and how each request's outcome is classified: `completed` (a finish_reason and
`[DONE]`), `cancelled` (the client closed the stream on purpose), `refused` (a 4xx/503 answer in the
dialect's shape, e.g. a full queue), `error` (an error event or a 5xx), `hung` (no byte for
`read_timeout_s`). A soak passes when nothing is `error` or `hung`. No server knowledge beyond HTTP.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

SHARED_PREFIX = (
    "You are a careful assistant for a team of engineers. Answer precisely, prefer short sentences, "
    "and say so when you do not know. "
) * 4
TOPICS = ["the sea", "compilers", "bread", "the moon", "trains", "bees", "rivers", "chess", "glass", "tea"]
# (weight, words of filler in the prompt, max_tokens): short chats, medium and long generations.
SHAPES = [(5, 0, 16), (3, 60, 64), (2, 200, 160)]


@dataclass
class LoadConfig:
    num_clients: int = 16
    duration_s: float = 600.0
    cancel_fraction: float = 0.2
    shared_prefix_fraction: float = 0.3
    read_timeout_s: float = 120.0
    model: str = "default"
    seed: int = 0


@dataclass
class LoadResult:
    outcomes: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)  # first few error texts, for the report
    num_output_chunks: int = 0

    def record(self, outcome: str, detail: str | None = None) -> None:
        self.outcomes[outcome] += 1
        if detail and len(self.errors) < 20:
            self.errors.append(f"{outcome}: {detail[:300]}")

    @property
    def num_requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def clean(self) -> bool:
        return self.outcomes["error"] == 0 and self.outcomes["hung"] == 0


def request_body(rng: random.Random, config: LoadConfig) -> dict:
    _, filler, max_tokens = rng.choices(SHAPES, weights=[s[0] for s in SHAPES])[0]
    topic = rng.choice(TOPICS)
    words = " ".join(rng.choice(TOPICS).split()[-1] for _ in range(filler))
    prompt = f"Tell me about {topic}. {words}".strip()
    messages = [{"role": "user", "content": prompt}]
    if rng.random() < config.shared_prefix_fraction:
        messages.insert(0, {"role": "system", "content": SHARED_PREFIX})
    return {
        "model": config.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": rng.choice([0.0, 0.7]),
        "stream": True,
    }


async def one_request(
    client: httpx.AsyncClient, body: dict, cancel_after: int | None, result: LoadResult
) -> None:
    """Streams one chat; closes it after `cancel_after` content chunks when that is set."""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                outcome = (
                    "error" if response.status_code >= 500 and response.status_code != 503 else "refused"
                )
                result.record(outcome, f"{response.status_code} {text}")
                return
            await _read_stream(response, cancel_after, result)
    except httpx.TimeoutException as exc:
        result.record("hung", f"{type(exc).__name__}")
    except httpx.HTTPError as exc:
        result.record("error", f"{type(exc).__name__}: {exc}")


async def _read_stream(response: httpx.Response, cancel_after: int | None, result: LoadResult) -> None:
    chunks, finish_reason = 0, None
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            outcome = "completed" if finish_reason else "error"
            result.record(outcome, None if finish_reason else "[DONE] without a finish_reason")
            return
        event = json.loads(data)
        if "error" in event:
            result.record("error", json.dumps(event["error"]))
            return
        choice = (event.get("choices") or [{}])[0]
        finish_reason = choice.get("finish_reason") or finish_reason
        chunks += 1
        result.num_output_chunks += 1
        if cancel_after is not None and chunks >= cancel_after and finish_reason is None:
            result.record("cancelled")
            return  # leaving the `async with` closes the connection mid-stream
    result.record("error", "the stream ended without [DONE]")


async def client_loop(
    index: int, base_url: str, config: LoadConfig, deadline_s: float, result: LoadResult
) -> None:
    rng = random.Random(config.seed * 1000 + index)
    timeout = httpx.Timeout(connect=10.0, read=config.read_timeout_s, write=10.0, pool=10.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, trust_env=False) as client:
        while time.monotonic() < deadline_s:
            body = request_body(rng, config)
            cancel_after = rng.randint(1, 6) if rng.random() < config.cancel_fraction else None
            await one_request(client, body, cancel_after, result)


async def run_load(base_url: str, config: LoadConfig) -> LoadResult:
    """Runs `num_clients` closed-loop clients until `duration_s` has passed and their last requests end."""
    result = LoadResult()
    deadline_s = time.monotonic() + config.duration_s
    clients = [client_loop(i, base_url, config, deadline_s, result) for i in range(config.num_clients)]
    await asyncio.gather(*clients)
    return result
