"""The embedder on the real bundled all-MiniLM-L6-v2: sentence-transformers parity and input checks."""

from __future__ import annotations

import engine.embedder as embedder_module
from engine.embedder import Embedder, bundled_model_dir
from engine.errors import InvalidRequestError

import numpy as np
import pytest
from transformers import AutoTokenizer

# Cosine scores that sentence-transformers prints for all-MiniLM-L6-v2 in its semantic-search
# example (sbert.net, examples/applications/semantic-search), rounded to 4 decimals there.
PUBLISHED_SCORES = [
    ("A man is eating pasta.", "A man is eating food.", 0.7035),
    ("A man is eating pasta.", "A man is eating a piece of bread.", 0.5272),
    ("A man is eating pasta.", "A man is riding a horse.", 0.1889),
    ("Someone in a gorilla costume is playing a set of drums.", "A monkey is playing drums.", 0.6433),
    ("Someone in a gorilla costume is playing a set of drums.", "A woman is playing violin.", 0.2564),
    ("A cheetah chases prey on across a field.", "A cheetah is running behind its prey.", 0.8253),
    ("A cheetah chases prey on across a field.", "A man is riding a horse.", 0.0650),
]
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a white horse on an enclosed ground.",
    "Hi",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(bundled_model_dir())


def embed_array(embedder: Embedder, inputs, dimensions: int | None = None) -> np.ndarray:
    vectors, _ = embedder.embed(inputs, dimensions)
    return np.array(vectors)


def test_describes_the_bundled_model(embedder):
    assert embedder.model_name == "all-MiniLM-L6-v2"
    assert embedder.dimensions == 384
    assert embedder.max_input_tokens == 256  # sentence_bert_config.json's max_seq_length


def test_matches_sentence_transformers_published_scores(embedder):
    for query, passage, expected in PUBLISHED_SCORES:
        query_vec, passage_vec = embed_array(embedder, [query, passage])
        assert abs(float(query_vec @ passage_vec) - expected) < 1e-3, (query, passage)


def test_related_sentences_score_high_and_unrelated_low(embedder):
    food, bread, baby = embed_array(embedder, SENTENCES[:3])
    assert food @ bread > 0.7  # 0.755 with sentence-transformers
    assert food @ baby < 0.0  # -0.105 with sentence-transformers


def test_vectors_are_unit_and_identical_inputs_agree(embedder):
    vectors = embed_array(embedder, ["A man is eating food.", "A man is eating food."])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] == pytest.approx(1.0, abs=1e-5)


def test_batch_equals_one_by_one(embedder):
    batch = embed_array(embedder, SENTENCES)
    singles = np.concatenate([embed_array(embedder, [s]) for s in SENTENCES])
    np.testing.assert_allclose(batch, singles, atol=1e-4)


def test_chunked_forwards_keep_input_order(embedder, monkeypatch):
    whole = embed_array(embedder, SENTENCES)
    monkeypatch.setattr(embedder_module, "MAX_BATCH_TOKENS", 24)  # a couple of sentences per forward
    np.testing.assert_allclose(embed_array(embedder, SENTENCES), whole, atol=1e-4)


def test_token_ids_equal_text(embedder, tokenizer):
    text_vectors = embed_array(embedder, SENTENCES[:2])
    bare_ids = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in SENTENCES[:2]]
    full_ids = [tokenizer(s)["input_ids"] for s in SENTENCES[:2]]
    np.testing.assert_allclose(embed_array(embedder, bare_ids), text_vectors, atol=1e-5)
    np.testing.assert_allclose(embed_array(embedder, full_ids), text_vectors, atol=1e-5)


def test_token_counts_include_special_tokens(embedder, tokenizer):
    expected = sum(len(tokenizer(s)["input_ids"]) for s in SENTENCES)
    _, num_tokens = embedder.embed(SENTENCES)
    assert num_tokens == expected == embedder.count_tokens(SENTENCES)
    assert embedder.count_tokens([[2158, 2003]]) == 4  # [CLS] man is [SEP]


def test_dimensions_truncate_and_renormalize(embedder):
    full = embed_array(embedder, SENTENCES[:2])
    short = embed_array(embedder, SENTENCES[:2], dimensions=64)
    assert short.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(
        short, full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True), atol=1e-5
    )
    assert embed_array(embedder, ["x"], dimensions=384).shape == (1, 384)


@pytest.mark.parametrize("dimensions", [0, -1, 385, True, 2.5])
def test_bad_dimensions_are_rejected(embedder, dimensions):
    with pytest.raises(InvalidRequestError) as err:
        embedder.embed(["hello"], dimensions=dimensions)
    assert err.value.param == "dimensions"
    assert "384" in err.value.message


def test_too_long_input_names_the_limit(embedder):
    long_text = "hello " * 300  # 300 word tokens plus [CLS] and [SEP]
    assert embedder.count_tokens([long_text]) == 302
    with pytest.raises(InvalidRequestError) as err:
        embedder.embed(["short", long_text])
    assert err.value.param == "input"
    assert "input[1]" in err.value.message and "302" in err.value.message and "256" in err.value.message
    embedder.embed(["hello " * 254])  # exactly at the limit is served


@pytest.mark.parametrize(
    "inputs",
    [[], [""], ["ok", ""], [[]], [[101, 30522]], [[-1]], [[1.5]], ["text", [2158]], "not a list"],
)
def test_invalid_inputs_are_rejected(embedder, inputs):
    with pytest.raises(InvalidRequestError) as err:
        embedder.embed(inputs)
    assert err.value.param == "input"
