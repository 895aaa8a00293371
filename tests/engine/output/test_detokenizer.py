"""IncrementalDetokenizer against real tokenizers trained in-test: byte-level BPE (GPT-2 / SmolLM
style) and a SentencePiece-style BPE with byte fallback (Llama style). No network."""

from __future__ import annotations

import engine  # noqa: F401  (loads OpenBLAS; must run before anything imports mlx)

# isort: split
import json
import random

from engine.output.detokenizer import IncrementalDetokenizer

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ASCII_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! Streaming text one token at a time.",
    "A café is not a cafe; naive is not naïve.",
    "  double  spaces,\ttabs and\nnew lines matter too.",
] * 20
# Repeated non-ASCII text makes byte-level merges that span character boundaries.
UNICODE_CORPUS = ["日本語のテキスト 中文字符 😀😀 👍🏽 café crème brûlée"] * 20
TEXTS = [
    "Hello, world! Café crème brûlée — naïve façade.",
    "日本語のテキストと中文字符の混合です。",
    "Emoji: 😀👍🏽🇫🇷 family 👨\u200d👩\u200d👧\u200d👦 end",
    "a😀b日c é  two  spaces\nnew line\ttab",
    "😀",
    " leading space then ü",
]


@pytest.fixture(scope="module")
def byte_level() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(ASCII_CORPUS + UNICODE_CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def sentencepiece() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(ASCII_CORPUS, trainer)
    # Llama's layout: every byte as a <0xNN> token for characters outside the vocabulary.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="<s>")


@pytest.fixture(params=["byte_level", "sentencepiece", "mlx_wrapper", "rust"])
def tokenizer(request, byte_level, sentencepiece):
    return {
        "byte_level": byte_level,
        "sentencepiece": sentencepiece,
        "mlx_wrapper": TokenizerWrapper(byte_level),
        "rust": byte_level.backend_tokenizer,
    }[request.param]


def _encode(tokenizer, text: str) -> list[int]:
    if hasattr(tokenizer, "encode_batch"):  # a raw tokenizers.Tokenizer
        return tokenizer.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


def _stream(tokenizer, prompt: list[int], output: list[int], chunk: int = 1) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.add_tokens(output[i : i + chunk]) for i in range(0, len(output), chunk)]
    pieces.append(detok.flush())
    assert detok.text == "".join(pieces)
    return pieces


def test_fixtures_split_characters_across_tokens(byte_level, sentencepiece):
    # Guards the tests below: they only prove something if multi-byte characters span tokens.
    for tok in (byte_level, sentencepiece):
        ids = _encode(tok, "😀 日本語")
        assert any("\ufffd" in tok.decode([i]) for i in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_reproduces_decode_without_broken_characters(tokenizer, text):
    ids = _encode(tokenizer, text)
    pieces = _stream(tokenizer, [], ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in piece for piece in pieces)


@pytest.mark.parametrize("text", TEXTS)
def test_output_after_a_prompt_is_the_continuation_of_the_prompt_text(tokenizer, text):
    ids = _encode(tokenizer, "Some prompt text: " + text)
    full = tokenizer.decode(ids)
    splits = [k for k in range(1, len(ids)) if full.startswith(tokenizer.decode(ids[:k]))]
    assert len(splits) > 3
    for k in splits:
        pieces = _stream(tokenizer, ids[:k], ids[k:])
        assert "".join(pieces) == full[len(tokenizer.decode(ids[:k])) :]
        assert not any("\ufffd" in piece for piece in pieces)


def test_chunked_adds_give_the_same_text(tokenizer):
    ids = _encode(tokenizer, " ".join(TEXTS))
    expected = tokenizer.decode(ids)
    for chunk in (2, 3, 7, len(ids)):
        assert "".join(_stream(tokenizer, [], ids, chunk)) == expected
    rng = random.Random(0)
    detok, start = IncrementalDetokenizer(tokenizer, []), 0
    while start < len(ids):
        size = rng.randint(0, 4)
        assert "\ufffd" not in detok.add_tokens(ids[start : start + size])
        start += size
    assert detok.text + detok.flush() == expected


def test_sentencepiece_keeps_the_leading_space_of_a_continuation(sentencepiece):
    prompt = _encode(sentencepiece, "Hello")
    output = _encode(sentencepiece, "Hello world")[len(prompt) :]
    assert sentencepiece.convert_ids_to_tokens(output)[0].startswith("▁")
    assert "".join(_stream(sentencepiece, prompt, output)) == " world"
    # With no prompt, the first token's space is dropped, as decode() does at the start of a text.
    assert "".join(_stream(sentencepiece, [], output)) == "world"


def test_incomplete_character_is_held_back_until_complete_or_dropped_at_finish(byte_level):
    prefix = _encode(byte_level, "ok ")
    emoji = _encode(byte_level, "🦊")  # not in the training corpus: several byte tokens
    assert len(emoji) > 1
    detok = IncrementalDetokenizer(byte_level, [])
    assert detok.add_tokens(prefix) == "ok "
    assert detok.add_tokens(emoji[:1]) == ""
    assert detok.add_tokens(emoji[1:]) == "🦊"
    cut = IncrementalDetokenizer(byte_level, prefix)
    assert cut.add_tokens(emoji[:1]) == ""
    assert cut.flush() == ""  # at finish, the bytes of a character never completed are dropped


@pytest.fixture(scope="module")
def bundled():
    """The engine's default model's tokenizer (byte-level BPE), as the engine loads it."""
    from engine.config import EngineConfig
    from engine.models.model_loader import load_tokenizer

    return load_tokenizer(EngineConfig())


@pytest.mark.parametrize("text", ["Sure: 😀", "答案：日本語", "Fox 🦊 and 猫"])
def test_a_reply_cut_inside_a_character_ends_before_it(bundled, text):
    """max_tokens can stop an output on a token that holds only part of a character's bytes."""
    ids = _encode(bundled, text)
    cuts = [k for k in range(1, len(ids)) if bundled.decode(ids[:k]).endswith("\ufffd")]
    assert cuts, "no token boundary falls inside a character"
    for k in range(1, len(ids) + 1):
        expected = bundled.decode(ids[:k]).rstrip("\ufffd")
        streamed = _stream(bundled, [], ids[:k])  # token by token, then the finish
        whole = IncrementalDetokenizer(bundled, [])
        assert "".join(streamed) == whole.add_tokens(ids[:k]) + whole.flush() == expected
        assert "\ufffd" not in "".join(streamed), f"cut after {k} tokens"


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_are_skipped_unless_asked_for(byte_level, skip):
    ids = _encode(byte_level, "done") + [byte_level.eos_token_id]
    detok = IncrementalDetokenizer(byte_level, [], skip_special_tokens=skip)
    text = detok.add_tokens(ids) + detok.flush()
    assert text == ("done" if skip else "done<|endoftext|>")


class _CountingTokenizer:
    """A slow-path tokenizer that records how many ids each decode call gets."""

    def __init__(self, inner: PreTrainedTokenizerFast):
        self.inner, self.max_ids = inner, 0

    def convert_ids_to_tokens(self, ids):
        return self.inner.convert_ids_to_tokens(ids)

    def decode(self, ids, skip_special_tokens, clean_up_tokenization_spaces):
        self.max_ids = max(self.max_ids, len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_work_per_token_does_not_grow_with_the_output(byte_level):
    ids = _encode(byte_level, " ".join(TEXTS * 60))
    counting = _CountingTokenizer(byte_level)
    pieces = _stream(counting, ids[:50], ids[50:])
    assert len(ids) > 2000 and counting.max_ids <= 12
    assert "".join(pieces) == byte_level.decode(ids[50:])
