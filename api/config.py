"""Typed config of the HTTP edge: API keys, CORS, body size, rate limit, timeout and request-field policy.

Validated once by the builder (deployments/app.py, the `security` and `limits` sections of the app's
args) and handed to the Ingress; api/guard.py applies it. Defaults: auth off, CORS off, no rate
limit, a 10 MiB body limit and a 600 s request timeout.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecurityConfig(_Strict):
    api_keys: list[str] = Field(
        default_factory=list,
        description="Accepted API keys, sent as `Authorization: Bearer <key>` or `x-api-key: <key>`. "
        "Auth is on when this or api_keys_env gives at least one key; /health and /metrics stay open.",
    )
    api_keys_env: str | None = Field(
        None,
        description="Name of an environment variable holding comma-separated API keys, added to api_keys. "
        "Read once by the builder, so it must be set where `serve run` runs.",
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description="Origins browsers may call from, e.g. ['https://app.example.com'], or ['*'] for any; "
        "empty: CORS off (no CORS headers, preflights are not answered).",
    )

    @field_validator("api_keys")
    @classmethod
    def _keys_are_tokens(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not key or key != key.strip() or " " in key:
                raise ValueError("an API key must be non-empty and hold no spaces; fix security.api_keys")
        return keys

    def with_env_keys(self) -> SecurityConfig:
        """This config with api_keys_env's keys resolved into api_keys (raises if the variable is unset)."""
        if self.api_keys_env is None:
            return self
        raw = os.environ.get(self.api_keys_env, "")
        env_keys = [key.strip() for key in raw.split(",") if key.strip()]
        if not env_keys:
            raise ValueError(
                f"security.api_keys_env names {self.api_keys_env!r}, which is unset or empty; export it "
                "(comma-separated keys) where `serve run` runs, or remove api_keys_env"
            )
        return SecurityConfig(
            api_keys=[*self.api_keys, *env_keys], cors_allow_origins=self.cors_allow_origins
        )


class RateLimitConfig(_Strict):
    """Each Ingress replica keeps its own buckets: with N replicas a client may reach N times the rate."""

    requests_per_minute: float = Field(
        ..., gt=0, description="Sustained requests per minute per client (its API key, else its IP)."
    )
    burst: int | None = Field(
        None, ge=1, description="Requests a rested client may send at once; default: a minute's worth."
    )

    @property
    def bucket_size(self) -> int:
        return self.burst if self.burst is not None else max(1, int(self.requests_per_minute))


class ImageLimitsConfig(_Strict):
    """Images in chat requests (served only by a vision-language model; see docs/vision.md)."""

    max_images_per_request: int = Field(
        8, ge=1, description="Most images one request may carry; beyond it the answer is 400."
    )
    max_image_bytes: int = Field(
        10 * 1024 * 1024, ge=1024, description="Largest image, as sent or fetched, in bytes; beyond it 400."
    )
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="Largest image in pixels (width x height), checked before decoding."
    )
    fetch_timeout_s: float = Field(
        10.0, gt=0, le=300, description="Longest time to fetch one http(s) image URL; beyond it 400."
    )
    allow_local_files: bool = Field(
        False,
        description="Let image URLs name files on the server (file:// or a path). Off: such URLs are 400, so "
        "no request can make the server read a local file. Turn on only for trusted clients.",
    )
    allow_private_urls: bool = Field(
        False,
        description="Let http(s) image URLs reach loopback, private, link-local and other non-public "
        "addresses (checked at every redirect). Off: such URLs are 400, so no request can make the server "
        "probe its own network. Turn on for images on a local network, with trusted clients only.",
    )


class LimitsConfig(_Strict):
    """Per-request limits. The waiting-queue bound is the engine's `max_waiting_requests` (beyond it:
    503 with Retry-After, 529 overloaded_error on Anthropic routes), since only the engine sees its queue."""

    max_body_bytes: int = Field(
        10 * 1024 * 1024, ge=1024, description="Largest request body; beyond it the answer is 413."
    )
    request_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Longest time one request may take, streams included; beyond it the engine aborts the "
        "request and the client gets 408 (or, in a started stream, an error event). None: no limit.",
    )
    rate_limit: RateLimitConfig | None = Field(
        None, description="Per-client token bucket; beyond it the answer is 429 with Retry-After. None: off."
    )
    images: ImageLimitsConfig = Field(
        default_factory=ImageLimitsConfig, description="Image count, size and fetching limits."
    )


class CompatibilityConfig(_Strict):
    """How leniently requests are read (docs/compatibility.md)."""

    strict_request_fields: bool = Field(
        False,
        description="True: a top-level request field this server does not know is a 400 naming it. False "
        "(default): it is accepted, left unread and logged once per route and name, since the OpenAI and "
        "Anthropic APIs add fields faster than any server follows.",
    )
    max_tokens_policy: Literal["error", "clamp"] = Field(
        "error",
        description="A chat or text completion whose prompt plus max_tokens exceeds the context: 'error' "
        "(default, OpenAI's convention) answers 400; 'clamp' lowers max_tokens to the room left, and the "
        "reply ends with finish_reason 'length' when it runs out, as Ollama and llama.cpp do. Anthropic's "
        "/v1/messages always clamps: its max_tokens is a ceiling.",
    )
