"""Structured output on the real model, through LLMEngine: every output parses and validates."""

import json

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest, SamplingParams, StructuredOutputs

import jsonschema
import pytest

from tests.engine.engine_helpers import chat_ids, run_to_completion

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum_and_bool": {
        "type": "object",
        "properties": {
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
            "bright": {"type": "boolean"},
        },
        "required": ["color", "bright"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "fruits": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}
        },
        "required": ["fruits"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "city": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "location": {
                        "type": "object",
                        "properties": {
                            # Bounded: greedy, a 135M model writes a float's digits until max_tokens.
                            "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                            "lon": {"type": "integer", "minimum": -180, "maximum": 180},
                        },
                        "required": ["lat", "lon"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "location"],
                "additionalProperties": False,
            },
            "population": {"type": "integer"},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"n": {"type": "integer"}, "kind": {"enum": ["walk", "run"]}},
                    "required": ["n", "kind"],
                    "additionalProperties": False,
                },
                "maxItems": 2,
            }
        },
        "required": ["steps"],
        "additionalProperties": False,
    },
}
PROMPT = "Answer in JSON: describe something you like."
# Without a schema, the prompt must name keys: greedy, the 135M model otherwise nests objects forever.
JSON_OBJECT_PROMPT = 'Give a JSON object with keys "name" and "age" for a person.'
MAX_TOKENS = 200


def _request(
    llm: LLMEngine, rid: str, spec: StructuredOutputs | None, prompt: str = PROMPT, **params
) -> GenerateRequest:
    sampling = SamplingParams(**{"max_tokens": MAX_TOKENS, **params}, structured=spec)
    return GenerateRequest(rid, chat_ids(llm, prompt), sampling)


def _text(outputs) -> str:
    return "".join(o.new_text for o in outputs)


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 7}], ids=["greedy", "t1"]
)
def test_every_schema_validates_in_one_batch_with_free_requests(llm, sampling):
    requests = [
        _request(llm, name, StructuredOutputs(json_schema=s), **sampling) for name, s in SCHEMAS.items()
    ]
    json_object = StructuredOutputs(json_object=True)
    requests.append(_request(llm, "json_object", json_object, JSON_OBJECT_PROMPT, **sampling))
    requests += [_request(llm, f"free{i}", None, temperature=0.0, max_tokens=40) for i in range(2)]
    outputs = run_to_completion(llm, {0: requests[:4], 2: requests[4:]})
    for name, schema in SCHEMAS.items():
        assert outputs[name][-1].finish_reason == "stop", (name, _text(outputs[name]))
        jsonschema.validate(json.loads(_text(outputs[name])), schema)
    assert outputs["json_object"][-1].finish_reason == "stop"
    assert isinstance(json.loads(_text(outputs["json_object"])), dict)
    for i in range(2):  # the free requests sample as if alone: the masks touched only their own rows
        assert outputs[f"free{i}"][-1].finish_reason in ("stop", "length")
        assert not _text(outputs[f"free{i}"]).startswith("{")
    assert llm.structured.num_live == 0


def test_seeded_constrained_sampling_is_reproducible_and_varies_by_seed(llm):
    spec = StructuredOutputs(json_schema=SCHEMAS["person"])
    runs = [
        run_to_completion(llm, {0: [_request(llm, "r", spec, temperature=1.0, seed=seed)]})["r"]
        for seed in (1, 1, 2, 3)
    ]
    texts = [_text(run) for run in runs]
    assert texts[0] == texts[1]
    assert len(set(texts[1:])) > 1
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMAS["person"])


def test_constrained_logprobs_put_all_mass_on_allowed_tokens(llm):
    spec = StructuredOutputs(json_schema=SCHEMAS["enum_and_bool"])
    outputs = run_to_completion(llm, {0: [_request(llm, "r", spec, temperature=0.0, logprobs=5)]})["r"]
    entries = [lp for o in outputs for lp in o.logprobs or []]
    assert len(entries) == sum(len(o.new_token_ids) for o in outputs)
    for entry in entries:
        assert len(entry.top) == 5 and entry.top[0] == (entry.token_id, entry.logprob)
        assert sum(2.718281828**lp for _, lp in entry.top) <= 1.0 + 1e-4


def test_max_tokens_cuts_a_constrained_output_with_length(llm):
    spec = StructuredOutputs(json_schema=SCHEMAS["nested"])
    outputs = run_to_completion(llm, {0: [_request(llm, "r", spec, temperature=0.0, max_tokens=5)]})["r"]
    assert outputs[-1].finish_reason == "length" and _text(outputs).startswith("{")


def test_an_aborted_constrained_request_drops_its_matcher(llm):
    llm.add_request(_request(llm, "gone", StructuredOutputs(json_object=True), temperature=0.0))
    llm.step()
    llm.step()
    assert llm.structured.num_live == 1
    llm.abort_request("gone")
    outputs = llm.step()
    assert [o.finish_reason for o in outputs if o.request_id == "gone"] == ["abort"]
    assert llm.structured.num_live == 0


def test_a_bad_schema_is_refused_at_add_request(llm):
    with pytest.raises(InvalidRequestError) as err:
        llm.add_request(_request(llm, "bad", StructuredOutputs(json_schema={"type": "objekt"})))
    assert err.value.param == "response_format"
    assert not llm.has_unfinished_requests()


def test_a_grammar_the_vocabulary_cannot_write_fails_its_request_naming_the_param(llm):
    spec = StructuredOutputs(grammar="start: /\U00061db8/")  # needs byte 0xF1: no SmolLM2 token has it
    free = _request(llm, "free", None, temperature=0.0, max_tokens=5)
    outputs = run_to_completion(llm, {0: [_request(llm, "r", spec, temperature=0.0), free]})
    assert outputs["r"][-1].finish_reason == "error" and outputs["r"][-1].error_param == "grammar"
    assert "0xF1" in (outputs["r"][-1].error or "")
    assert outputs["free"][-1].finish_reason == "length" and llm.structured.num_live == 0


def test_preemption_by_recompute_keeps_each_matcher(llm):
    """20 blocks of 16 tokens cannot hold eight requests' KV: some are preempted and recomputed, and
    their constrained outputs equal the unpressured engine's."""
    tiny = LLMEngine(
        EngineConfig(
            kv_cache_memory_bytes=20 * 737_280, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=160
        )
    )
    spec = StructuredOutputs(json_schema=SCHEMAS["person"])

    def texts(eng: LLMEngine) -> dict[str, str]:
        requests = [
            _request(
                eng, f"r{i}", spec, f"Describe person number {i} in JSON.", temperature=0.0, max_tokens=60
            )
            for i in range(8)
        ]
        return {rid: _text(outs) for rid, outs in run_to_completion(eng, {0: requests}).items()}

    pressured = texts(tiny)
    assert tiny.scheduler.num_preemptions > 0
    assert pressured == texts(llm)
    assert tiny.structured.num_live == 0


def test_each_parallel_sample_has_its_own_matcher(llm):
    request = _request(llm, "n", StructuredOutputs(json_schema=SCHEMAS["person"]), temperature=1.0, seed=3)
    request.n = 3
    outputs = run_to_completion(llm, {0: [request]})["n"]
    texts = ["".join(o.new_text for o in outputs if o.index == i) for i in range(3)]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMAS["person"])
    assert len(set(texts)) > 1
