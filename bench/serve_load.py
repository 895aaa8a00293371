"""HTTP load generator for `bench/serve.py`: streaming chat completions from N concurrent clients.

Owns the prompts, the request loop and the per-request timings; it knows nothing about which server
answers (the caller passes the model name and any extra body fields) and starts no process.

Timing map of one streamed request:
    sent ──TTFT──> first content delta ──gap──> delta ──gap──> ... last delta ──> [DONE]
    ITL (time per output token after the first) = (t_last - t_first) / (completion_tokens - 1)
    chunk gaps: every `gap` above (a chunk may carry several tokens), pooled over a level's requests
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

import httpx

WORDS = [
    "river",
    "mountain",
    "lantern",
    "harbor",
    "meadow",
    "copper",
    "violin",
    "orchard",
    "glacier",
    "canyon",
    "whisper",
    "ember",
    "falcon",
    "marble",
    "thunder",
    "velvet",
    "compass",
    "island",
    "willow",
    "saddle",
    "beacon",
    "quartz",
    "nectar",
    "prairie",
    "tundra",
    "spindle",
    "harvest",
    "lagoon",
    "cobalt",
    "monsoon",
    "parchment",
    "summit",
    "thistle",
    "voyage",
    "crimson",
    "ivory",
    "juniper",
    "kettle",
]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float | None = None
    itl_s: float | None = None  # decode time per output token after the first
    delta_gap_s: float | None = None  # mean time between two content deltas
    # Every time between two consecutive content-carrying chunks; result_dicts keeps only percentiles.
    chunk_gaps_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    num_deltas: int = 0
    token_count_source: str = "usage"  # "usage" (stream_options.include_usage) or "deltas"
    error: str | None = None


@dataclass
class LevelResult:
    concurrency: int
    num_requests: int
    wall_s: float
    requests: list[RequestResult] = field(default_factory=list)

    def summary(self) -> dict:
        ok = [r for r in self.requests if r.ok]
        ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
        itls = [r.itl_s for r in ok if r.itl_s is not None]
        gaps = sorted(g for r in ok for g in r.chunk_gaps_s)
        tokens = sum(r.completion_tokens for r in ok)
        errors = [r.error for r in self.requests if not r.ok]
        return {
            "concurrency": self.concurrency,
            "num_requests": self.num_requests,
            "num_errors": len(errors),
            "error_samples": sorted(set(errors))[:3],
            "wall_s": self.wall_s,
            "ttft_p50_ms": _pct(ttfts, 50) * 1000 if ttfts else None,
            "ttft_p90_ms": _pct(ttfts, 90) * 1000 if ttfts else None,
            "itl_mean_ms": statistics.fmean(itls) * 1000 if itls else None,
            "delta_gap_mean_ms": _mean_ms([r.delta_gap_s for r in ok]),
            "chunk_gap_p50_ms": _pct(gaps, 50) * 1000 if gaps else None,
            "chunk_gap_p90_ms": _pct(gaps, 90) * 1000 if gaps else None,
            "tokens_per_delta": tokens / max(1, sum(r.num_deltas for r in ok)),
            "aggregate_tok_s": tokens / self.wall_s if self.wall_s > 0 else None,
            "completion_tokens_mean": tokens / len(ok) if ok else None,
            "prompt_tokens_mean": _mean([r.prompt_tokens for r in ok]),
            "token_count_sources": sorted({r.token_count_source for r in ok}),
        }


def _pct(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile: the smallest value with at least pct% of values at or below it."""
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _mean_ms(values: list[float | None]) -> float | None:
    mean = _mean(values)
    return None if mean is None else mean * 1000


def check_loopback(base_url: str) -> None:
    host = urlparse(base_url).hostname
    if host not in LOOPBACK_HOSTS:
        raise ValueError(
            f"target {base_url} is not a loopback address; this benchmark only sends to 127.0.0.1"
        )


def make_messages(index: int, nonce: str, prompt_words: int) -> list[dict]:
    """A distinct ~prompt_words-token prompt: the nonce comes first, so no two requests share a KV block."""
    rng = random.Random(f"{nonce}-{index}")
    words = " ".join(rng.choice(WORDS) for _ in range(prompt_words))
    system = f"Session {nonce}-{index}. You are a storyteller who always writes long, detailed answers."
    user = f"Here are some words: {words}. Write a very long story that uses every one of them."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def request_body(model: str, messages: list[dict], max_tokens: int, extra: dict) -> dict:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return {**body, **extra}


async def stream_one(client: httpx.AsyncClient, url: str, body: dict, timeout_s: float) -> RequestResult:
    delta_times: list[float] = []  # filled as the stream arrives, so a failure can say how far it got
    t0 = time.perf_counter()
    try:
        return await asyncio.wait_for(_stream(client, url, body, t0, delta_times), timeout_s)
    except TimeoutError:
        return RequestResult(ok=False, error=f"timeout after {timeout_s:.0f} s", num_deltas=len(delta_times))
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as exc:
        where = f"after {time.perf_counter() - t0:.1f} s and {len(delta_times)} content deltas"
        return RequestResult(ok=False, error=f"{type(exc).__name__} {where}: {exc!r}"[:300])


async def _stream(client: httpx.AsyncClient, url: str, body: dict, t0: float, delta_times: list[float]):
    usage: dict | None = None
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            return RequestResult(ok=False, error=f"HTTP {resp.status_code}: {text[:200]}")
        async for line in resp.aiter_lines():
            chunk = _parse_sse(line)
            if chunk is None:
                continue
            if chunk.get("error"):
                return RequestResult(ok=False, error=f"stream error: {json.dumps(chunk['error'])[:200]}")
            usage = chunk.get("usage") or usage
            if _has_content(chunk):
                delta_times.append(time.perf_counter())
    return _result(t0, delta_times, usage)


def _parse_sse(line: str) -> dict | None:
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)


def _has_content(chunk: dict) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return True
    return False


def _result(t0: float, delta_times: list[float], usage: dict | None) -> RequestResult:
    if not delta_times:
        return RequestResult(ok=False, error="stream ended without any content delta")
    source = "usage" if usage and usage.get("completion_tokens") else "deltas"
    tokens = int(usage["completion_tokens"]) if source == "usage" else len(delta_times)
    span = delta_times[-1] - delta_times[0]
    gaps = len(delta_times) - 1
    return RequestResult(
        ok=True,
        ttft_s=delta_times[0] - t0,
        itl_s=span / (tokens - 1) if tokens > 1 and gaps else None,
        delta_gap_s=span / gaps if gaps else None,
        chunk_gaps_s=[b - a for a, b in itertools.pairwise(delta_times)],
        completion_tokens=tokens,
        prompt_tokens=(usage or {}).get("prompt_tokens"),
        num_deltas=len(delta_times),
        token_count_source=source,
    )


async def run_level(base_url: str, bodies: list[dict], concurrency: int, timeout_s: float) -> LevelResult:
    """Sends every body once, `concurrency` at a time; wall time runs from the first send to the last end."""
    check_loopback(base_url)
    url = f"{base_url}/v1/chat/completions"
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits, trust_env=False) as client:

        async def worker() -> None:
            while not queue.empty():
                results.append(await stream_one(client, url, queue.get_nowait(), timeout_s))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall_s = time.perf_counter() - t0
    return LevelResult(concurrency, len(bodies), wall_s, results)


def result_dicts(level: LevelResult) -> list[dict]:
    return [_request_dict(r) for r in level.requests]


def _request_dict(result: RequestResult) -> dict:
    """A request as JSON; its chunk gaps become p50/p90/max ms (the pooled ones are in the summary)."""
    row = asdict(result)
    gaps = sorted(row.pop("chunk_gaps_s"))
    row["chunk_gap_p50_ms"] = round(_pct(gaps, 50) * 1000, 2) if gaps else None
    row["chunk_gap_p90_ms"] = round(_pct(gaps, 90) * 1000, 2) if gaps else None
    row["chunk_gap_max_ms"] = round(gaps[-1] * 1000, 2) if gaps else None
    return row
