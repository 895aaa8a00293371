"""Speculative decoding on the real bundled model: greedy output token for token equal to plain decoding,
for every request of a mixed batch (drafting and non-drafting requests, preemptions), with n-gram drafts
and with a draft model."""

import random

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig, SpeculativeConfig
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams, StructuredOutputs
from engine.spec_decode.setup import SpeculativeConfigError

import pytest

from bench.draft_models import write_layer_prefix
from tests.architectures import ARCHITECTURES
from tests.engine.engine_helpers import chat_ids, run_to_completion, token_ids
from tests.tiny_text_model import VOCAB_SIZE, build_tiny_model

CODE = """def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
"""
EDITS = ["rename load to read", "rename save to write", "add a docstring to load", "use pathlib in save"]
# Small pools, so the batch runs out of blocks and preempts.
SETTINGS = {"num_kv_blocks": 24, "max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 384}


def _engine(**speculative) -> LLMEngine:
    spec = SpeculativeConfig(**speculative) if speculative else None
    return LLMEngine(EngineConfig(**SETTINGS, speculative=spec))


@pytest.fixture(scope="module")
def expected() -> dict:
    """The mixed batch decoded plainly."""
    plain = _engine()
    return _summary(run_to_completion(plain, _batch(plain)))


def _batch(llm: LLMEngine, only: set[str] | None = None) -> dict[int, list[GenerateRequest]]:
    """Drafting requests (greedy edits, stops, penalties, min_tokens) and ones that decode plainly
    (logprobs, n > 1, a grammar), arriving over the first steps."""
    edit = [chat_ids(llm, f"{CODE}\nRewrite this code: {task}. Output only the code.") for task in EDITS]
    greedy = {"temperature": 0.0, "max_tokens": 28}
    requests = [GenerateRequest(f"edit{i}", ids, SamplingParams(**greedy)) for i, ids in enumerate(edit)]
    requests += [
        GenerateRequest("stop", edit[0], SamplingParams(**greedy, stop=["return"])),
        GenerateRequest("penalty", edit[1], SamplingParams(**greedy, presence_penalty=0.6, repetition_penalty=1.2)),
        GenerateRequest("min_tokens", chat_ids(llm, "Say hi."), SamplingParams(**greedy, min_tokens=12)),
        GenerateRequest("logprobs", edit[2], SamplingParams(**greedy, logprobs=2)),
        GenerateRequest("n2", edit[3], SamplingParams(**greedy), n=2),
        GenerateRequest(
            "json", chat_ids(llm, "Give a JSON object about a cat."),
            SamplingParams(**greedy, structured=StructuredOutputs(json_object=True)),
        ),
    ]  # fmt: skip
    requests = [r for r in requests if only is None or r.request_id in only]
    return {i: [r] for i, r in enumerate(requests)}


def _summary(outputs) -> dict:
    """Per request and sample: tokens, text, finish reason and the logprobs' tokens (their values vary
    with the batch's composition in the last float digits, as any batched engine's do)."""
    summary = {}
    for rid, outs in outputs.items():
        for index in sorted({o.index for o in outs}):
            mine = [o for o in outs if o.index == index]
            logprobs = [(lp.token_id, [t for t, _ in lp.top]) for o in mine for lp in o.logprobs or []]
            text = "".join(o.new_text for o in mine)
            summary[rid, index] = (token_ids(mine), text, mine[-1].finish_reason, logprobs)
    return summary


def test_ngram_greedy_outputs_equal_plain_decoding_in_a_mixed_batch_with_preemption(expected):
    llm = _engine(method="ngram", num_speculative_tokens=4)
    got = _summary(run_to_completion(llm, _batch(llm)))
    assert got == expected
    stats = llm.speculator.stats
    print(f"ngram: {stats}, preemptions {llm.scheduler.num_preemptions}")
    assert stats.num_accepted_tokens > 0 and llm.scheduler.num_preemptions > 0
    assert llm.stats().spec_num_draft_tokens == stats.num_draft_tokens
    assert llm.compute.speculative.startswith("ngram")
    assert llm.pool.num_free == llm.pool.num_blocks  # every block came back


def test_draft_model_greedy_outputs_equal_plain_decoding_with_preemption(tmp_path_factory):
    """A tiny random-weight Llama (sliding windows on every other layer) and its first 3 of 4 layers as
    the draft: they agree on some tokens and not on others, at a fraction of the bundled model's cost."""
    folder = tmp_path_factory.mktemp("tiny_draft")
    target = build_tiny_model(folder / "target", ARCHITECTURES["llama"] | {"num_hidden_layers": 4})
    draft = write_layer_prefix(target, folder / "draft", 3)
    settings = {"model": str(target), "num_kv_blocks": 16, "max_num_seqs": 6, "max_model_len": 256}

    def batch() -> dict[int, list[GenerateRequest]]:
        rng = random.Random(0)
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        prompts = [[rng.randrange(VOCAB_SIZE) for _ in range(rng.randrange(20, 60))] for _ in range(6)]
        return {i: [GenerateRequest(f"r{i}", ids, params)] for i, ids in enumerate(prompts)}

    plain = LLMEngine(EngineConfig(**settings))
    expected = _summary(run_to_completion(plain, batch()))
    spec = SpeculativeConfig(method="draft_model", model=str(draft), num_speculative_tokens=3)
    llm = LLMEngine(EngineConfig(**settings, speculative=spec))
    assert _summary(run_to_completion(llm, batch())) == expected
    stats = llm.speculator.stats
    print(f"draft model: {stats}, preemptions {llm.scheduler.num_preemptions}")
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # kept and rejected drafts both
    assert stats.accepted_per_pos[1] > 0 and llm.scheduler.num_preemptions > 0
    # A sampled, seeded request drafts from the draft's distribution and is verified by rejection.
    sampled = GenerateRequest("sampled", [1, 2, 3], SamplingParams(temperature=0.8, seed=1, max_tokens=16))
    outputs = run_to_completion(llm, {0: [sampled]})["sampled"]
    assert len(token_ids(outputs)) == 16 or outputs[-1].finish_reason == "stop"


def test_draft_model_with_another_tokenizer_is_a_clear_load_error(tmp_path_factory):
    folder = tmp_path_factory.mktemp("other_vocab")
    target = build_tiny_model(folder / "target", ARCHITECTURES["llama"])
    other = build_tiny_model(folder / "other", ARCHITECTURES["llama"] | {"vocab_size": 256})
    spec = SpeculativeConfig(method="draft_model", model=str(other))
    with pytest.raises(SpeculativeConfigError, match="another tokenizer"):
        LLMEngine(EngineConfig(model=str(target), speculative=spec))


def test_mtp_without_heads_is_a_clear_load_error():
    with pytest.raises(SpeculativeConfigError, match="multi-token-prediction"):
        _engine(method="mtp")


def test_a_model_with_recurrent_state_refuses_speculation_at_load(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hybrid")
    hybrid = build_tiny_model(folder / "qwen3_next", ARCHITECTURES["qwen3_next"])
    spec = SpeculativeConfig(method="ngram")
    with pytest.raises(SpeculativeConfigError, match="recurrent state"):
        LLMEngine(EngineConfig(model=str(hybrid), speculative=spec))
