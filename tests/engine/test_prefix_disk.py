"""The prefix cache's disk tier across an engine restart, on the real bundled model: the second engine
reads the first one's blocks from disk, and its greedy output is the same token for token."""

from __future__ import annotations

import logging

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
from engine.config import EngineConfig, PrefixCacheDiskConfig
from engine.core.kv_cache_manager import chain_hash
from engine.llm_engine import LLMEngine
from engine.messages import GenerateRequest

from tests.engine.engine_helpers import chat_ids, greedy, run_to_completion, token_ids

TEXT_A = "Summarise this log of a build that failed twice before it passed. " * 20
TEXT_B = "Here is a long design note about paged attention and prefix caches. " * 20
NUM_OUTPUT = 12


def _engine(path) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            kv_cache_memory_bytes=64 << 20,
            max_num_batched_tokens=128,
            prefix_cache_disk=PrefixCacheDiskConfig(path=str(path), max_gb=1.0),
        )
    )


def _serve(llm: LLMEngine, request_id: str, prompt: list[int]) -> list[int]:
    outputs = run_to_completion(llm, {0: [GenerateRequest(request_id, prompt, greedy(NUM_OUTPUT))]})
    return token_ids(outputs[request_id])


def test_a_restarted_engine_reads_prefixes_from_disk_and_skips_a_corrupted_file(tmp_path, caplog):
    first = _engine(tmp_path)
    prompt_a, prompt_b = chat_ids(first, TEXT_A), chat_ids(first, TEXT_B)
    assert len(prompt_a) >= 250 and len(prompt_b) >= 250
    out_a, out_b = _serve(first, "a", prompt_a), _serve(first, "b", prompt_b)
    first.close()  # flushes the writer thread
    block_size = first.kv.block_size
    del first

    second = _engine(tmp_path)
    store = second.kv.disk
    assert store is not None
    hashes_b = _block_hashes(prompt_b, block_size)
    # Every full block of both prompts, those of B's last step included (close() copies them out).
    assert all(store.contains(h) for h in _block_hashes(prompt_a, block_size) + hashes_b)
    bad = store.path_of(hashes_b[5])
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in the sixth block of B
    bad.write_bytes(bytes(data))

    assert _serve(second, "a2", prompt_a) == out_a
    num_full = (len(prompt_a) - 1) // block_size
    assert second.stats().prefix_cache_disk_hits == num_full * block_size
    with caplog.at_level(logging.WARNING):
        assert _serve(second, "b2", prompt_b) == out_b
    # B's first blocks (the chat template's system prompt) are A's, in RAM now; the rest come from
    # disk up to the bad file, where the match ends.
    num_shared = next(
        i for i, (x, y) in enumerate(zip(_block_hashes(prompt_a, block_size), hashes_b)) if x != y
    )
    assert 0 < num_shared < 5
    stats = second.stats()
    assert stats.prefix_cache_disk_hits == (num_full + 5 - num_shared) * block_size
    assert bad.name in caplog.text and "checksum" in caplog.text
    second.close()
    # The bad file was removed, and B's recomputed blocks written back: that block's file is whole again.
    assert store.load(hashes_b[5]) is not None


def _block_hashes(prompt: list[int], block_size: int) -> list[bytes]:
    hashes: list[bytes] = []
    for i in range(len(prompt) // block_size):
        hashes.append(
            chain_hash(hashes[-1] if hashes else None, prompt[i * block_size : (i + 1) * block_size])
        )
    return hashes
