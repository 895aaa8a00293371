"""The engine with device sampling (engine/output/device_sampler.py) on the CPU and the real bundled model:
greedy output as with host sampling, sampled rows kept on the device under async scheduling, seeds that
replay whatever the batch, and a row whose sampling raises failing alone."""

import json

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams, StructuredOutputs
from engine.output import step_sampler

import jsonschema
import pytest

from tests.engine.engine_helpers import chat_ids, greedy, run_to_completion, token_ids

PROMPTS = ["What is the capital of France?", "Name three colours.", "Tell me a fact about cats."]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture
def device_llm(async_llm, monkeypatch) -> LLMEngine:
    """The shared async engine sampling on the device, as a GPU's engine does by default (device_sampling
    None there): sampled rows without host state stay on the device between steps."""
    monkeypatch.setattr(async_llm.sampler, "on_device", True)
    return async_llm


def _staggered(llm: LLMEngine, params: SamplingParams, prefix: str) -> dict[str, list[int]]:
    prompts = [chat_ids(llm, p) for p in PROMPTS]
    arrivals = {2 * i: [GenerateRequest(f"{prefix}{i}", ids, params)] for i, ids in enumerate(prompts)}
    return {
        rid.removeprefix(prefix): token_ids(outs) for rid, outs in run_to_completion(llm, arrivals).items()
    }


def test_greedy_output_equals_host_sampling_with_and_without_async(device_llm, llm, monkeypatch):
    host = _staggered(llm, greedy(8), "host")
    assert _staggered(device_llm, greedy(8), "async") == host
    monkeypatch.setattr(llm.sampler, "on_device", True)  # the synchronous engine, now sampling on device
    assert _staggered(llm, greedy(8), "sync") == host


def test_a_mixed_batch_finishes_and_only_rows_without_host_state_stay_on_the_device(device_llm, monkeypatch):
    stayed, read_now = set(), set()
    launch = device_llm.sampler.launch

    def recording(step, pipeline):
        out = launch(step, pipeline)
        stayed.update(out.later.rows if out.later else ())
        read_now.update(out.now.rows if out.now else ())
        return out

    monkeypatch.setattr(device_llm.sampler, "launch", recording)
    prompt = chat_ids(device_llm, "Answer in JSON: describe a person.")
    requests = [
        GenerateRequest("greedy", prompt, greedy(12)),
        GenerateRequest("nucleus", prompt, SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7)),
        GenerateRequest("logprobs", prompt, SamplingParams(max_tokens=10, min_tokens=10, logprobs=3, seed=1)),
        GenerateRequest(
            "penalties",
            prompt,
            SamplingParams(
                max_tokens=12, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5
            ),
        ),
        GenerateRequest(
            "json",
            prompt,
            SamplingParams(max_tokens=120, temperature=0.0, structured=StructuredOutputs(json_schema=PERSON)),
        ),
    ]
    outputs = run_to_completion(device_llm, {0: requests[:3], 1: requests[3:]})
    assert set(outputs) == {r.request_id for r in requests}
    assert all(outs[-1].finish_reason in ("stop", "length") for outs in outputs.values())
    lengths = {rid: len(token_ids(outs)) for rid, outs in outputs.items()}
    assert lengths["logprobs"] == 10 and outputs["logprobs"][-1].finish_reason == "length"
    assert all(lengths[rid] <= 12 for rid in ("greedy", "nucleus", "penalties"))
    logprobs = [lp for o in outputs["logprobs"] for lp in o.logprobs or []]
    assert [lp.token_id for lp in logprobs] == token_ids(outputs["logprobs"])
    assert all(len(lp.top) == 3 and lp.top[0][1] >= lp.logprob - 1e-4 for lp in logprobs)
    assert outputs["json"][-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(o.new_text for o in outputs["json"])), PERSON)
    assert {"nucleus", "logprobs", "greedy"} <= stayed and {"penalties", "json"} <= read_now
    assert not {"penalties", "json"} & stayed
    assert device_llm.pool.num_free == device_llm.pool.num_blocks


def test_seeded_outputs_replay_and_do_not_depend_on_the_batch(device_llm, llm, monkeypatch):
    """The lone run reads every token at once (no pending outputs); the batched one leaves the row on the
    device between steps, so its seeded positions count pending outputs."""
    prompt = chat_ids(device_llm, PROMPTS[0])

    def seeded(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True)

    monkeypatch.setattr(llm.sampler, "on_device", True)
    alone = token_ids(run_to_completion(llm, {0: [GenerateRequest("alone", prompt, seeded(11))]})["alone"])
    others = [
        greedy(6),
        SamplingParams(max_tokens=12, temperature=1.2),
        SamplingParams(max_tokens=4, top_k=3),
    ]
    requests = [
        GenerateRequest(f"o{i}", chat_ids(device_llm, PROMPTS[1 + i % 2]), p) for i, p in enumerate(others)
    ]
    arrivals = {
        0: requests[:2],
        2: [GenerateRequest("again", prompt, seeded(11)), GenerateRequest("other_seed", prompt, seeded(12))],
        3: requests[2:],
    }
    outputs = run_to_completion(device_llm, arrivals)
    assert token_ids(outputs["again"]) == alone and len(set(alone)) > 4
    assert token_ids(outputs["other_seed"]) != alone


def test_a_row_whose_device_sampling_raises_fails_alone(device_llm, monkeypatch):
    poison = {13: 1.0}  # a logit_bias that marks the row this test breaks
    sample = step_sampler.sample_on_device

    def breaking(logits, rows, uniforms, *draw):
        if any(row.params.logit_bias == poison for row in rows):
            raise RuntimeError("broken row")
        return sample(logits, rows, uniforms, *draw)

    monkeypatch.setattr(step_sampler, "sample_on_device", breaking)
    params = [
        greedy(8),
        SamplingParams(max_tokens=8, logit_bias=poison),
        SamplingParams(max_tokens=8, seed=2),
    ]
    prompt = chat_ids(device_llm, PROMPTS[1])
    requests = [GenerateRequest(f"f{i}", prompt, p) for i, p in enumerate(params)]
    outputs = run_to_completion(device_llm, {0: requests})
    assert outputs["f1"][-1].finish_reason == "error" and "broken row" in outputs["f1"][-1].error
    assert all(outputs[f"f{i}"][-1].finish_reason in ("stop", "length") for i in (0, 2))
    assert device_llm.pool.num_free == device_llm.pool.num_blocks
