from __future__ import annotations

import pytest

from api.max_tokens import fit_max_tokens


@pytest.mark.parametrize(
    ("max_tokens", "prompt", "policy", "expected"),
    [
        (32000, 1000, "clamp", 7192),  # lowered to the room the prompt leaves
        (32000, 1000, "error", 32000),  # left for the engine's 400
        (100, 1000, "clamp", 100),  # fits: unchanged
        (None, 1000, "clamp", None),  # unset: the engine fills the room itself
        (10, 8192, "clamp", 10),  # no room at all: still the engine's 400
    ],
)
def test_fit_max_tokens(max_tokens, prompt, policy, expected):
    assert fit_max_tokens(max_tokens, prompt, 8192, policy) == expected
