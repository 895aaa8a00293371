"""Structured output: request specs compiled to llguidance grammars, one matcher per constrained request.

Owns the grammar cache, the live matchers and each step's allowed-token bitmasks. Never touches
logits (engine/output/sampler.py applies a row's mask) nor request state (engine/output/output_processor.py ends a
request when `accept` says its grammar is complete). llguidance was chosen by measurement:
bench/structured_engines.py, docs/benchmarks.md.

Life of a constrained request: `validate` at add_request (any thread; a bad spec raises
InvalidRequestError), `prepare` before the forward of each step it samples in (a matcher is made
on first use and the masks are filled on a background thread while the model runs), `mask` when
its sampling row is built, `accept` for each committed token (after an "error", `failure` says
whether the request is to blame), `remove` at any finish. Preemption
by recompute keeps the matcher: the request's tokens do not change.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, Protocol

from engine.errors import InvalidRequestError
from engine.messages import StructuredOutputs

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stub only

logger = logging.getLogger(__name__)

# Compact JSON: free whitespace lets a small model emit newlines until max_tokens (vLLM's
# disable_any_whitespace); a schema may still ask for it through its "x-guidance" options.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
MAX_CACHED_GRAMMARS = 256

GrammarEnd = Literal["stop", "error"]


class _Sampling(Protocol):
    """What `prepare` reads of a scheduled item (engine.scheduler.ScheduledRequest)."""

    @property
    def needs_sample(self) -> bool: ...

    @property
    def request(self) -> Any: ...


class StructuredOutputManager:
    def __init__(self, tokenizer, overlap: bool = True):
        """`tokenizer`: mlx-lm's TokenizerWrapper. `overlap`: fill masks on a background thread."""
        self._hf_tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)
        self._eos_token_ids = sorted(tokenizer.eos_token_ids)
        self._llg_tokenizer: llguidance.LLTokenizer | None = None  # ~0.3 s to build: on first use
        self._lock = threading.Lock()  # guards the cache and the tokenizer: validate runs on any thread
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()  # pristine, never advanced
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._unwritable_hits: set[str] = set()  # requests whose grammar needed an unwritable byte
        self._unwritable = b""  # bytes no token contains, so no output can hold them
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks") if overlap else None
        self._executor = llguidance.LLExecutor(num_threads=1)
        self._pending: Future | None = None
        self._rows: dict[str, int] = {}  # request id -> row of `_bitmask` for this step
        self._bitmask = np.zeros((0, 0), dtype=np.int32)

    # ---- any thread ---------------------------------------------------------------------------

    def validate(self, spec: StructuredOutputs | None) -> None:
        """Compiles the spec (cached) so a bad schema or grammar fails its request at once."""
        if spec is not None:
            self._compiled(spec)

    # ---- the step thread ----------------------------------------------------------------------

    def prepare(self, scheduled: Iterable[_Sampling]) -> None:
        """Starts filling the masks of this step's constrained rows; call before the forward."""
        self._wait()
        requests = [s.request for s in scheduled if s.needs_sample and s.request.params.structured]
        self._rows = {r.request_id: i for i, r in enumerate(requests)}
        if not requests:
            return
        matchers = [(self._matcher(r.request_id, r.params.structured), i) for i, r in enumerate(requests)]
        self._bitmask = llguidance.numpy.allocate_token_bitmask(len(matchers), self._tokenizer().vocab_size)
        if self._pool is None:
            self._fill(matchers, self._bitmask)
        else:
            self._pending = self._pool.submit(self._fill, matchers, self._bitmask)

    def mask(self, request_id: str) -> np.ndarray | None:
        """The request's packed allowed-token bitmask for this step (bit t of word t // 32 set:
        token t allowed), or None when it is not constrained."""
        row = self._rows.get(request_id)
        if row is None:
            return None
        self._wait()
        return self._bitmask[row]

    def accept(self, request_id: str, token_id: int) -> GrammarEnd | None:
        """Advances the request's matcher: "stop" once its grammar is complete, "error" if the
        token breaks the grammar (it cannot, when the token was sampled under this matcher's mask)."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return None
        self._wait()  # a mask fill still running borrows the matcher
        if not matcher.consume_token(token_id):
            logger.error("request %s: token %d rejected by its grammar: %s", request_id, token_id,
                         matcher.get_error())  # fmt: skip
            if self._unwritable and self._was_allowed(request_id, token_id):
                self._unwritable_hits.add(request_id)
            return "error"
        return "stop" if matcher.is_stopped() else None

    def failure(self, request_id: str, spec: StructuredOutputs) -> InvalidRequestError | None:
        """After `accept` said "error": the request's own fault, when its grammar (`spec`) needs bytes
        this vocabulary cannot write; None when the engine is to blame."""
        if request_id not in self._unwritable_hits:
            return None
        self._unwritable_hits.discard(request_id)
        return self._unwritable_error(_grammar_param(spec))

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)
        self._unwritable_hits.discard(request_id)

    @property
    def num_live(self) -> int:
        return len(self._matchers)

    # ---- internals ----------------------------------------------------------------------------

    def _matcher(self, request_id: str, spec: StructuredOutputs) -> llguidance.LLMatcher:
        matcher = self._matchers.get(request_id)
        if matcher is None:
            matcher = self._matchers[request_id] = self._compiled(spec).deep_copy()
        return matcher

    def _was_allowed(self, request_id: str, token_id: int) -> bool:
        row = self._rows.get(request_id)
        return row is not None and bool((int(self._bitmask[row, token_id // 32]) >> (token_id % 32)) & 1)

    def _unwritable_error(self, param: str) -> InvalidRequestError:
        # llguidance plans forced text through the Hugging Face tokenizer, which silently drops such
        # bytes, so its mask then allows a token the grammar refuses (SmolLM2 has no token for the
        # UTF-8 lead bytes 0xF1 and 0xF2: U+40000 to U+BFFFF).
        listed = ", ".join(f"0x{b:02X}" for b in self._unwritable)
        return InvalidRequestError(
            f"the output format asks for text this model cannot write: its vocabulary has no token "
            f"for the bytes {listed}, so no character that needs one can be generated; let the format "
            "allow other characters",
            param,
        )

    def _fill(self, matchers: list[tuple[llguidance.LLMatcher, int]], bitmask: np.ndarray) -> None:
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, matchers, bitmask)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _compiled(self, spec: StructuredOutputs) -> llguidance.LLMatcher:
        key, grammar, param = _grammar(spec)
        with self._lock:
            if (hit := self._cache.get(key)) is not None:
                self._cache.move_to_end(key)
                return hit
            tokenizer = self._tokenizer(param)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)  # drops the GIL while compiling
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {_what(spec)}: {matcher.get_error()}", param)
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return matcher

    def _tokenizer(self, param: str = "response_format") -> llguidance.LLTokenizer:
        """`param`: the field a request's error names if this model's tokenizer cannot be used."""
        if self._llg_tokenizer is None:
            try:
                tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, eos_token=self._eos_token_ids)
            except ValueError as exc:
                raise InvalidRequestError(
                    f"structured output needs a fast (Rust) Hugging Face tokenizer; this model's: {exc}",
                    param,
                ) from exc
            written = set(tokenizer.decode_bytes(list(range(tokenizer.vocab_size))))
            self._unwritable = bytes(sorted(set(range(256)) - written))
            self._llg_tokenizer = tokenizer
        return self._llg_tokenizer


def _grammar(spec: StructuredOutputs) -> tuple[str, str, str]:
    """(cache key, llguidance grammar, the parameter to blame) for a spec with exactly one field set."""
    chosen = [n for n in ("json_schema", "json_object", "grammar") if getattr(spec, n) not in (None, False)]
    if len(chosen) != 1:
        raise InvalidRequestError(
            f"structured output takes exactly one of json_schema, json_object, grammar; got {chosen or 'none'}",
            spec.param or "response_format",
        )
    param = _grammar_param(spec)
    if spec.grammar is not None:
        if not isinstance(spec.grammar, str) or not spec.grammar.strip():
            raise InvalidRequestError("the grammar must be a non-empty Lark string", param)
        return "lark:" + spec.grammar, llguidance.LLMatcher.grammar_from_lark(spec.grammar), param
    schema = ANY_JSON_OBJECT if spec.json_object else spec.json_schema
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"a JSON schema must be an object; got {type(schema).__name__}", param)
    try:
        text = json.dumps(schema, allow_nan=False)  # key order kept: properties are generated in it
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"invalid JSON schema: {exc}", param) from exc
    return "json:" + text, grammar, param


def _grammar_param(spec: StructuredOutputs) -> str:
    if spec.param is not None:
        return spec.param
    return "grammar" if spec.grammar is not None else "response_format"


def _what(spec: StructuredOutputs) -> str:
    return "grammar" if spec.grammar is not None else "JSON schema"
