"""StructuredOutputManager on the bundled model's real tokenizer, and the sampler's use of its masks."""

import json
from dataclasses import dataclass

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.core.request import Request
from engine.errors import InvalidRequestError
from engine.messages import SamplingParams, StructuredOutputs
from engine.models.model_loader import load_tokenizer
from engine.output.sampler import LOGPROB_FLOOR, Sampler, SamplingRow
from engine.output.structured_output import StructuredOutputManager

import mlx.core as mx
import numpy as np
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
    "required": ["name", "tags"],
    "additionalProperties": False,
}


@dataclass
class Item:  # the two fields of a ScheduledRequest that the manager reads
    request: Request
    needs_sample: bool = True


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(EngineConfig())


@pytest.fixture(params=[True, False], ids=["overlap", "inline"])
def manager(request, tokenizer) -> StructuredOutputManager:
    return StructuredOutputManager(tokenizer, overlap=request.param)


def make_request(request_id: str, spec: StructuredOutputs | None) -> Request:
    return Request(request_id, [1, 2, 3], SamplingParams(structured=spec), max_tokens=100)


def allowed(mask: np.ndarray, vocab: int) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(mask.view(np.uint8), count=vocab, bitorder="little")).tolist())


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_valid_instance_is_allowed_token_by_token_and_completes(manager, tokenizer):
    vocab = len(tokenizer.get_vocab())
    request = make_request("r", StructuredOutputs(json_schema=SCHEMA))
    manager.validate(request.params.structured)
    ids = encode(tokenizer, json.dumps({"name": "Bo", "tags": ["a", "b"]}, separators=(",", ":")))
    ends = []
    for token_id in ids:
        manager.prepare([Item(request)])
        allowed_ids = allowed(manager.mask("r"), vocab)
        assert token_id in allowed_ids
        assert not allowed_ids & tokenizer.eos_token_ids  # EOS only where the grammar allows it
        ends.append(manager.accept("r", token_id))
    assert ends == [None] * (len(ids) - 1) + ["stop"]


def test_the_first_mask_allows_only_an_object_opening(manager, tokenizer):
    vocab = len(tokenizer.get_vocab())
    request = make_request("r", StructuredOutputs(json_object=True))
    manager.validate(request.params.structured)
    manager.prepare([Item(request)])
    texts = {tokenizer.decode([t]) for t in allowed(manager.mask("r"), vocab)}
    assert texts and all(text.startswith("{") for text in texts)


def test_unconstrained_and_non_sampling_rows_get_no_mask(manager):
    constrained = make_request("c", StructuredOutputs(json_object=True))
    manager.validate(constrained.params.structured)
    manager.prepare([Item(make_request("plain", None)), Item(constrained, needs_sample=False)])
    assert manager.mask("plain") is None and manager.mask("c") is None
    assert manager.accept("plain", 5) is None


def test_a_token_the_grammar_forbids_is_an_error(manager, tokenizer):
    request = make_request("r", StructuredOutputs(json_object=True))
    manager.validate(request.params.structured)
    manager.prepare([Item(request)])
    assert manager.accept("r", encode(tokenizer, "hello")[0]) == "error"
    assert manager.failure("r", request.params.structured) is None  # the engine's fault, not the request's


def test_a_grammar_needing_bytes_the_vocabulary_lacks_is_the_requests_fault(manager, tokenizer):
    # SmolLM2 has no token for the UTF-8 lead byte 0xF1 (U+40000 to U+7FFFF), and llguidance's
    # forced-text plan drops it: the mask then allows the next byte's token, which the grammar refuses.
    request = make_request("r", StructuredOutputs(grammar="start: /\U00061db8/"))
    manager.validate(request.params.structured)
    manager.prepare([Item(request)])
    (first,) = allowed(manager.mask("r"), len(tokenizer.get_vocab()))
    assert manager.accept("r", first) == "error"
    failure = manager.failure("r", request.params.structured)
    assert isinstance(failure, InvalidRequestError) and failure.param == "grammar"
    assert "0xF1" in failure.message and "0xF2" in failure.message


def test_matchers_are_per_request_and_dropped_on_remove(manager, tokenizer):
    spec = StructuredOutputs(json_schema=SCHEMA)
    manager.validate(spec)
    a, b = make_request("a", spec), make_request("b", spec)
    manager.prepare([Item(a), Item(b)])
    opening = encode(tokenizer, '{"')
    for token_id in opening:
        assert manager.accept("a", token_id) is None
    manager.prepare([Item(a), Item(b)])
    assert not np.array_equal(manager.mask("a"), manager.mask("b"))  # b has not moved
    assert manager.num_live == 2
    manager.remove("a")
    manager.remove("b")
    assert manager.num_live == 0


def test_a_lark_grammar_may_embed_a_json_schema(manager, tokenizer):
    grammar = 'start: "call " obj\nobj: %json{"type": "object", "properties": {"x": {"type": "integer"}}, ' \
        '"required": ["x"], "additionalProperties": false}'  # fmt: skip
    request = make_request("r", StructuredOutputs(grammar=grammar))
    manager.validate(request.params.structured)
    ends = []
    for token_id in encode(tokenizer, 'call {"x":42}'):
        manager.prepare([Item(request)])
        ends.append(manager.accept("r", token_id))
    assert ends[-1] == "stop" and "error" not in ends


@pytest.mark.parametrize(
    "spec, param",
    [
        (StructuredOutputs(json_schema={"type": "no-such-type"}), "response_format"),
        (
            StructuredOutputs(json_schema={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}),
            "response_format",
        ),
        (StructuredOutputs(json_schema={"type": "number", "minimum": float("nan")}), "response_format"),
        (StructuredOutputs(json_schema=["not", "a", "dict"]), "response_format"),  # type: ignore[arg-type]
        (StructuredOutputs(), "response_format"),
        (StructuredOutputs(json_object=True, grammar="start: /a/"), "response_format"),
        (StructuredOutputs(grammar="start: undefined_rule"), "grammar"),
        (StructuredOutputs(grammar="   "), "grammar"),
        # A spec that names the request field it came from is blamed by that name.
        (
            StructuredOutputs(json_schema={"type": "no-such-type"}, param="text.format.schema"),
            "text.format.schema",
        ),
        (StructuredOutputs(grammar="start: undefined_rule", param="guided_regex"), "guided_regex"),
        (StructuredOutputs(json_object=True, grammar="start: /a/", param="tools"), "tools"),
    ],
)
def test_a_bad_spec_is_an_invalid_request_naming_the_param(tokenizer, spec, param):
    with pytest.raises(InvalidRequestError) as err:
        StructuredOutputManager(tokenizer).validate(spec)
    assert err.value.param == param


def test_compiled_grammars_are_cached_by_spec(tokenizer):
    manager = StructuredOutputManager(tokenizer)
    manager.validate(StructuredOutputs(json_schema=dict(SCHEMA)))
    manager.validate(StructuredOutputs(json_schema=dict(SCHEMA)))
    manager.validate(StructuredOutputs(json_object=True))
    assert len(manager._cache) == 2


# ---- the sampler applies the mask --------------------------------------------------------------


def packed(allowed_ids: list[int], vocab: int) -> np.ndarray:
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[allowed_ids] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


def test_the_sampler_picks_only_allowed_tokens_and_masks_ids_past_the_mask():
    vocab, mask_vocab = 100, 64  # the model's logits are wider than the tokenizer's vocabulary
    logits = np.zeros((3, vocab), dtype=np.float32)
    logits[:, 90] = 50.0  # the model's favourite lies past the mask: never allowed
    logits[:, 7] = 5.0
    mask = packed([3, 7, 40], mask_vocab)
    rows = [
        SamplingRow(SamplingParams(temperature=0.0), [1], [], allowed_token_mask=mask),
        SamplingRow(SamplingParams(temperature=1.0, seed=1), [1], [], allowed_token_mask=mask),
        SamplingRow(SamplingParams(temperature=0.0), [1], []),
    ]
    result = Sampler(0).sample(mx.array(logits), rows)
    assert result.token_ids[0] == 7 and result.token_ids[1] in (3, 7, 40) and result.token_ids[2] == 90


def test_logprobs_of_a_constrained_row_are_over_the_allowed_tokens():
    logits = np.arange(64, dtype=np.float32)[None, :]
    row = SamplingRow(
        SamplingParams(temperature=0.0, logprobs=3), [1], [], allowed_token_mask=packed([5, 9], 64)
    )
    lp = Sampler(0).sample(mx.array(logits), [row]).logprobs[0]
    assert lp.token_id == 9 and lp.top[0] == (9, lp.logprob)
    assert np.isclose(np.exp(lp.logprob) + np.exp(lp.top[1][1]), 1.0)  # mass only on 5 and 9
    assert lp.top[2][1] == LOGPROB_FLOOR  # a masked token: finite, so JSON can carry it


def test_the_grammar_wins_over_min_tokens_when_it_allows_only_eos():
    eos = 2
    row = SamplingRow(SamplingParams(temperature=0.0, min_tokens=5), [1], [], {eos}, packed([eos], 64))
    assert Sampler(0).sample(mx.zeros((1, 64)), [row]).token_ids == [eos]


@pytest.mark.parametrize(
    "grammar, text", [(r"start: /[0-9]{3}-[a-z]{3}/", "123-abc"), ('start: "yes" | "no way"', "no way")]
)
def test_regex_and_choice_grammars_complete_on_a_match(manager, tokenizer, grammar, text):
    request = make_request("r", StructuredOutputs(grammar=grammar))
    manager.validate(request.params.structured)
    ends = []
    for token_id in encode(tokenizer, text):
        manager.prepare([Item(request)])
        assert token_id in allowed(manager.mask("r"), len(tokenizer.get_vocab()))
        ends.append(manager.accept("r", token_id))
    assert ends[-1] == "stop" and "error" not in ends
