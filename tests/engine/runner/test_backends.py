"""The one place that picks compute paths: the CPU paths for a plain float32 Llama on the CPU, the
portable path for each role a setting turns off, and a reason for every fast path it did not take."""

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig
from engine.runner import backends
from engine.runner.fast_path import Target
from engine.runner.model_head import split_head

from tests.engine.runner.cpu.test_cpu_decode import tiny_llama, tiny_storage


def _target(device: str = "cpu") -> Target:
    model = tiny_llama()
    return Target(model, tiny_storage(model), device, split_head(model))


def test_a_float32_llama_on_the_cpu_gets_every_cpu_path():
    choice = backends.choose(_target(), EngineConfig())
    assert choice.names == {
        "decode": "c_forward",
        "math": "cpu_math",
        "attention": "window_attention",
        "prefill": "c_forward",  # prefill chunks run as rows of the C forward's step
    }
    assert choice.not_taken == {
        "cuda_fused": "needs MLX's CUDA backend",
        "cuda_graph": "needs MLX's CUDA backend",
        "paired_prefill": "c_forward serves prefill",
    }
    paths = choice.compute_paths("float32")
    assert paths.kv_write == "decode rows: the C forward; prefill chunks: the C forward"
    assert choice.attention.in_place is not None and choice.attention.launch_per_layer
    assert choice.paired is None


def test_without_the_c_forward_two_prefill_chunks_pair():
    choice = backends.choose(_target(), EngineConfig(cpu_decode=False))
    assert choice.names["decode"] == "mlx" and choice.names["prefill"] == "paired_prefill"
    assert choice.paired is not None
    assert choice.compute_paths("float32").kv_write.endswith("the paged cache, after each pair of chunks")


def test_a_setting_turns_its_path_off_and_the_portable_path_serves():
    config = EngineConfig(cpu_decode=False, cpu_math=False, kv_in_place=False, paired_prefill=False)
    choice = backends.choose(_target(), config)
    assert choice.names == backends.PORTABLE and choice.decode is None and choice.paired is None
    for name, setting in [
        ("c_forward", "cpu_decode"),
        ("cpu_math", "cpu_math"),
        ("window_attention", "kv_in_place"),
        ("paired_prefill", "paired_prefill"),
    ]:
        assert choice.not_taken[name] == f"engine.{setting} is false"  # fmt: skip
    assert choice.attention.in_place is None and choice.attention.prefill_attention is None


def test_another_device_says_why_each_cpu_path_is_off():
    # A GPU device name without MLX's CUDA backend (as on this machine): nothing device-specific serves.
    choice = backends.choose(_target("gpu"), EngineConfig())
    assert choice.names == backends.PORTABLE and not choice.attention.launch_per_layer
    assert choice.not_taken["c_forward"] == "needs MLX's CPU backend"
    assert choice.not_taken["paired_prefill"] == "needs MLX's CPU backend (two CPU streams)"
    assert choice.not_taken["cpu_math"] == "off by default on gpu (engine.cpu_math: true turns it on)"


def test_the_paths_see_whether_the_4_bit_rows_kernel_may_serve():
    assert backends.choose(_target(), EngineConfig()).target.quantized_rows
    assert not backends.choose(_target(), EngineConfig(cuda_quantized_rows=False)).target.quantized_rows
    assert backends.choose(_target(), EngineConfig()).compute_paths("float32").quantized_rows == "off"
