"""The `max_tokens_policy` rule: what a max_tokens larger than the room a prompt leaves becomes.

'error' (OpenAI's convention) leaves it to the engine, which answers 400 naming max_tokens; 'clamp'
(Ollama's and llama.cpp's, and Anthropic's ceiling semantics) lowers it to the room, so the reply ends
with finish_reason 'length' when it runs out. A prompt with no room at all is a 400 either way.
"""

from __future__ import annotations

from typing import Literal

MaxTokensPolicy = Literal["error", "clamp"]


def fit_max_tokens(
    max_tokens: int | None, num_prompt_tokens: int, max_model_len: int, policy: MaxTokensPolicy
) -> int | None:
    room = max_model_len - num_prompt_tokens
    if policy == "clamp" and max_tokens is not None and 0 < room < max_tokens:
        return room
    return max_tokens
