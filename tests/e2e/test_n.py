"""`n` > 1 through the real app and the official openai SDK: one engine request per prompt fans out into
n choices that share the prompt's KV blocks (read from /v1/status), streamed and not, chat and completions."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.e2e

MODEL = "smol-e2e"
ASK = [{"role": "user", "content": "Write a list of random words."}]


def sampled_chat(client, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=10, temperature=1.0, seed=11, **kwargs
    )


def test_chat_n_3_gives_three_choices_each_with_its_own_logprobs(client):
    response = sampled_chat(client, n=3, logprobs=True, top_logprobs=2)
    single = sampled_chat(client)
    assert [c.index for c in response.choices] == [0, 1, 2]
    texts = [c.message.content for c in response.choices]
    assert all(texts) and len(set(texts)) == 3, "each choice samples with its own seed"
    assert all(c.finish_reason in ("stop", "length") for c in response.choices)
    # (Joined token texts need not equal the content: a byte token of a split character reads "\ufffd".)
    entries = [[(e.token, e.logprob) for e in c.logprobs.content] for c in response.choices]
    assert len({tuple(e) for e in entries}) == 3, "each choice carries the logprobs of its own tokens"
    for choice in response.choices:
        assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in choice.logprobs.content)
    usage = response.usage
    assert usage.prompt_tokens == single.usage.prompt_tokens, "the shared prompt is counted once"
    assert usage.completion_tokens == sum(len(c.logprobs.content) for c in response.choices)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_n_3_stream_matches_non_stream_and_sums_usage(client):
    # Greedy: a sampled token may differ between two requests whose prompt was or was not already cached.
    args = {"model": MODEL, "messages": ASK, "max_tokens": 10, "temperature": 0, "n": 3}
    whole = client.chat.completions.create(**args)
    texts, roles, finishes = ["", "", ""], [0, 0, 0], [None, None, None]
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    chunks = list(stream)
    for chunk in chunks[:-1]:
        assert chunk.usage is None and len(chunk.choices) == 1
        choice = chunk.choices[0]
        texts[choice.index] += choice.delta.content or ""
        roles[choice.index] += choice.delta.role == "assistant"
        finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == [c.message.content for c in whole.choices]
    assert roles == [1, 1, 1], "each choice's first chunk carries the role, once"
    assert finishes == [c.finish_reason for c in whole.choices]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_completions_n_2_over_two_prompts_numbers_choices_prompt_major(client):
    prompts = ["1, 2, 3,", "10, 20, 30,"]
    args = {"model": MODEL, "max_tokens": 4, "temperature": 0, "extra_body": {"ignore_eos": True}}
    singles = [client.completions.create(prompt=p, **args) for p in prompts]
    whole = client.completions.create(prompt=prompts, n=2, **args)
    assert sorted(c.index for c in whole.choices) == [0, 1, 2, 3]
    texts = [c.text for c in sorted(whole.choices, key=lambda c: c.index)]
    expected = [singles[0].choices[0].text] * 2 + [singles[1].choices[0].text] * 2
    assert texts == expected, "choice p * n + j is sample j of prompt p (greedy: all equal the n=1 text)"
    assert whole.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert whole.usage.completion_tokens == 4 * 4
    streamed = ["", "", "", ""]
    stream = client.completions.create(
        prompt=prompts, n=2, stream=True, stream_options={"include_usage": True}, **args
    )
    chunks = list(stream)
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts
    assert chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_the_choices_share_the_prompts_blocks(client, http):
    """Samples 1 and 2 wait for sample 0's prefill, then hit the prefix cache for every full prompt block."""
    unique = f"Reference code {uuid.uuid4().hex}. " + "Summarise the history of the printing press. " * 8
    before = http.get("/v1/status").json()["total"]
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": unique}], max_tokens=4, temperature=0, n=3
    )
    after = http.get("/v1/status").json()["total"]
    assert len(response.choices) == 3
    block_size, num_prompt = after["block_size"], response.usage.prompt_tokens
    full_blocks = (num_prompt - 1) // block_size  # a prefix match always leaves the last token to compute
    assert full_blocks >= 5
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    assert hits >= 2 * full_blocks * block_size, (hits, full_blocks)
    assert after["num_blocks_used"] == 0 and after["num_running"] == 0
