"""The load-time proof that a model decodes several rows in one forward as it decodes each row alone.

Owns only the probe: it decodes three short sequences of different lengths on a scratch storage of its
own (a few KV blocks, three state slots), once as a batch and once row by row, and compares the logits.
A batch fails where the model builds positions from an int offset (gpt_bigcode), where its scores
carry a repeats axis and need a 5-D mask (gemma2: tried next), or where it places queries at the end of
the padded context (minimax_m3's block selection): such a model decodes one row per forward. Never
touches the engine's own storages.

    row   prompt tokens      then one decode token, batched and alone; each row's blocks follow the
    0     3                  previous row's (block_size 16: [0], [1, 2], [3])
    1     block_size + 5
    2     7
"""

from __future__ import annotations

from engine.runner.kv_storage import KVStorage, LayerShape
from engine.runner.layer_caches import LayerCaches
from engine.runner.paged_attention import StepLayout
from engine.runner.state_storage import StateRows, StateShape, StateStorage

import mlx.core as mx
from mlx import nn

_NUM_ROWS = 3


def probe_batching(
    layers: LayerCaches,
    kv_shapes: list[LayerShape],
    state_shapes: list[list[StateShape | None]],
    dtype: mx.Dtype,
    block_size: int,
) -> None:
    """Sets `layers.batched_decode`, `layers.mask_ndim` and, where rows go apart, `unbatched_reason`."""
    if not layers.batched_decode:  # the model's own caches hold one request each
        return
    probe = _Probe(layers, kv_shapes, state_shapes, dtype, block_size)
    alone = mx.concatenate([probe.decode([row], 4) for row in range(_NUM_ROWS)])
    # Of the largest logit: float32 rows agree to ~1e-5 of it; half-precision matmuls of other shapes
    # may round apart by a few percent, while a wrong position or mask moves logits by tens of percent.
    tolerance = 1e-3 if dtype == mx.float32 else 0.1
    errors = []
    for ndim in (4, 5):  # 5: (B, 1, 1, L, S) for scores shaped (B, kv_heads, repeats, L, S)
        try:
            batched = probe.decode(list(range(_NUM_ROWS)), ndim)
            diff = float(mx.max(mx.abs(batched - alone)).item())  # type: ignore[arg-type]  # a float32 scalar
        except Exception as exc:  # noqa: BLE001  (any failure means: not this way)
            errors.append(f"{ndim}-D masks: {type(exc).__name__}: {exc}")
            continue
        scale = max(float(mx.max(mx.abs(alone)).item()), 1.0)  # type: ignore[arg-type]
        if diff <= tolerance * scale:
            layers.mask_ndim = ndim
            return
        errors.append(f"{ndim}-D masks: batched logits differ from one row's by {diff:.3g}")
    layers.batched_decode = False
    layers.unbatched_reason = "; ".join(errors)


class _Probe:
    def __init__(
        self,
        layers: LayerCaches,
        kv_shapes: list[LayerShape],
        state_shapes: list[list[StateShape | None]],
        dtype: mx.Dtype,
        block_size: int,
    ):
        self.layers, self.block_size = layers, block_size
        self.model: nn.Module = layers.model
        self.lens = [3, block_size + 5, 7]
        self.tables: list[list[int]] = []
        for num_tokens in self.lens:  # room for the prompt and the decoded token, in fresh blocks
            first = sum(len(t) for t in self.tables)
            self.tables.append(list(range(first, first + num_tokens // block_size + 1)))
        self.storage = KVStorage(kv_shapes, sum(len(t) for t in self.tables), block_size, dtype)
        self.states = StateStorage(state_shapes, _NUM_ROWS) if layers.num_state else None
        for row, num_tokens in enumerate(self.lens):  # each prompt alone, its state saved
            caches = self._caches([row], [0], num_tokens, 4)
            self.model(mx.array([list(range(1, num_tokens + 1))]), cache=caches)
            layers.write_back(caches)
        mx.eval(self.storage.arrays(), self.states.arrays() if self.states is not None else [])

    def decode(self, rows: list[int], mask_ndim: int) -> mx.array:
        """(len(rows), vocab) logits of one new token per row; the rows' states are not saved, so
        every call decodes the same token from the same state."""
        caches = self._caches(rows, [self.lens[r] for r in rows], 1, mask_ndim)
        tokens = mx.array([[r + 1] for r in rows], dtype=mx.int32)
        return self.model(tokens, cache=caches)[:, -1, :].astype(mx.float32)

    def _caches(self, rows: list[int], offsets: list[int], num_new: int, mask_ndim: int) -> list:
        tables = [self.tables[r] for r in rows]
        layout = StepLayout(offsets, num_new, tables, self.block_size, mask_ndim=mask_ndim)
        state_rows = None
        if self.states is not None:
            state_rows = StateRows(rows, [o == 0 for o in offsets], self.states.zero_slot)
        return self.layers.build(self.storage, self.states, layout, state_rows)
