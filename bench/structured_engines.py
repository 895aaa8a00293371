"""Grammar engines for structured output, compared on the bundled model's tokenizer.

    python bench/structured_engines.py [--walks 20] [--out bench/results/structured_engines.json]

For each engine (llguidance; outlines-core; xgrammar is left out: it pulls torch) and each schema:
compile time (tokenizer-bound grammar from a JSON schema, cold), mask time per token (the mean
over a valid instance's tokens, mask then advance), and correctness: `--walks` random walks that
pick among the allowed tokens (70% of the time a "closing" one, so strings end) until the engine says
the grammar is complete; every finished walk must parse and validate against its schema.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.models.model_loader import load_tokenizer

import jsonschema
import numpy as np

SCHEMAS: dict[str, dict] = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum+array": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "ok": {"type": "boolean"},
        },
        "required": ["color", "tags", "ok"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
                "required": ["id", "address"],
                "additionalProperties": False,
            },
            "scores": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
        },
        "required": ["user", "scores"],
        "additionalProperties": False,
    },
}
INSTANCES = {
    "flat": {"name": "Ada Lovelace", "age": 36},
    "enum+array": {"color": "green", "tags": ["x", "long tag"], "ok": True},
    "nested": {"user": {"id": 7, "address": {"city": "Paris", "zip": "75001"}}, "scores": [1.5, 2]},
}
CLOSERS = ('"', "}", "]", ",", "0", "1", "t", "f")


@dataclass
class Matcher:
    """The operations the bench needs, over either engine."""

    fill: Callable[[np.ndarray], None]  # writes the allowed-token bitmask (int32 words)
    advance: Callable[[int], None]
    done: Callable[[], bool]


class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, hf_tokenizer, eos_ids: list[int]):
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.llg, self.np = llguidance, llguidance.numpy
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=eos_ids)
        self.vocab_size = self.tokenizer.vocab_size

    def version(self) -> str:
        return self.llg.__version__

    def compile(self, schema: dict) -> Callable[[], Matcher]:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        pristine = self.llg.LLMatcher(self.tokenizer, grammar)
        assert not pristine.is_error(), pristine.get_error()

        def new() -> Matcher:
            m = pristine.deep_copy()
            return Matcher(
                lambda out: self.np.fill_next_token_bitmask(m, out[None, :]),
                lambda t: _check(m.consume_token(t), m.get_error),
                m.is_stopped,
            )

        return new


class OutlinesCoreEngine:
    name = "outlines-core"

    def __init__(self, hf_tokenizer, eos_ids: list[int]):
        import outlines_core

        self.oc = outlines_core
        self.vocab_size = len(hf_tokenizer.get_vocab())
        vocab: dict[bytes, list[int]] = {}
        for token_id in range(self.vocab_size):
            if token_id in eos_ids:
                continue
            vocab.setdefault(_token_bytes(hf_tokenizer, token_id), []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(eos_ids[0], vocab)

    def version(self) -> str:
        from importlib.metadata import version

        return version("outlines-core")

    def compile(self, schema: dict) -> Callable[[], Matcher]:
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
        index = self.oc.Index(regex, self.vocabulary)

        def new() -> Matcher:
            guide = self.oc.Guide(index)
            return Matcher(
                lambda out: guide.write_mask_into(out.ctypes.data, out.size, out.itemsize),
                guide.advance,
                guide.is_finished,
            )

        return new


def _check(ok: bool, error: Callable[[], str]) -> None:
    assert ok, error()


_BYTE_DECODER = None


def _token_bytes(hf_tokenizer, token_id: int) -> bytes:
    """A byte-level BPE token's bytes (GPT-2's printable-byte alphabet mapped back)."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        _BYTE_DECODER = _byte_decoder()
    token = hf_tokenizer.convert_ids_to_tokens(token_id)
    if all(c in _BYTE_DECODER for c in token):
        return bytes(_BYTE_DECODER[c] for c in token)
    return token.encode()


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for chr(256 + i)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table


def allowed_ids(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab_size])


def time_masks(new: Callable[[], Matcher], token_ids: list[int], words: int) -> float:
    matcher, mask = new(), np.zeros(words, dtype=np.int32)
    matcher.fill(mask)  # the first mask of a grammar builds lazy tables: not a per-token cost
    matcher = new()
    start = time.perf_counter()
    for token_id in token_ids:
        matcher.fill(mask)
        matcher.advance(token_id)
    return (time.perf_counter() - start) / len(token_ids)


def random_walk(new: Callable[[], Matcher], tokenizer, vocab_size: int, rng: random.Random) -> str | None:
    matcher, mask, out = new(), np.zeros((vocab_size + 31) // 32, dtype=np.int32), []
    closers = {t for t in range(vocab_size) if tokenizer.decode([t]).strip()[:1] in CLOSERS}
    for _ in range(400):
        if matcher.done():
            return tokenizer.decode(out)
        matcher.fill(mask)
        allowed = allowed_ids(mask, vocab_size).tolist()
        allowed = [t for t in allowed if t not in tokenizer.eos_token_ids] or allowed
        closing = [t for t in allowed if t in closers]
        token_id = rng.choice(closing if closing and rng.random() < 0.7 else allowed)
        if token_id in tokenizer.eos_token_ids:
            return tokenizer.decode(out)
        matcher.advance(token_id)
        out.append(token_id)
    return None


def bench_engine(eng, tokenizer, num_walks: int) -> list[dict]:
    rows = []
    words = (eng.vocab_size + 31) // 32
    for name, schema in SCHEMAS.items():
        start = time.perf_counter()
        new = eng.compile(schema)
        new()
        compile_s = time.perf_counter() - start
        ids = tokenizer.encode(json.dumps(INSTANCES[name], separators=(",", ":")), add_special_tokens=False)
        mask_s = time_masks(new, ids, words)
        rng, valid, finished = random.Random(0), 0, 0
        for _ in range(num_walks):
            text = random_walk(new, tokenizer, eng.vocab_size, rng)
            if text is not None:
                finished += 1
                valid += _validates(text, schema)
        rows.append(
            {
                "engine": eng.name,
                "version": eng.version(),
                "schema": name,
                "compile_ms": compile_s * 1e3,
                "mask_us_per_token": mask_s * 1e6,
                "walks_finished": finished,
                "walks_valid": valid,
            }
        )
        print(_row(rows[-1]), flush=True)
    return rows


def _validates(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _row(r: dict) -> str:
    return (
        f"| {r['engine']} {r['version']} | {r['schema']} | {r['compile_ms']:.1f} | "
        f"{r['mask_us_per_token']:.0f} | {r['walks_valid']}/{r['walks_finished']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--walks", type=int, default=20)
    parser.add_argument("--out", default="bench/results/structured_engines.json")
    args = parser.parse_args()
    wrapper = load_tokenizer(EngineConfig())
    hf, eos_ids = wrapper._tokenizer, sorted(wrapper.eos_token_ids)
    print("| engine | schema | compile ms | mask + advance µs/token | valid / finished walks |")
    print("|---|---|---|---|---|")
    rows = []
    for cls in (LLGuidanceEngine, OutlinesCoreEngine):
        start = time.perf_counter()
        eng = cls(hf, eos_ids)
        print(f"| {cls.name} tokenizer setup | | {(time.perf_counter() - start) * 1e3:.0f} | | |", flush=True)
        rows += bench_engine(eng, wrapper, args.walks)
    Path(args.out).write_text(json.dumps({"walks": args.walks, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
