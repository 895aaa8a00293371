"""Parallel sampling (`n` > 1): one GenerateRequest fanned out into n engine requests, its samples.

Owns the parent -> samples map and the samples held back until sample 0's prompt is in the prefix
cache, so the others hit it for every full prompt block and recompute only the last, partial one.
Never touches the scheduler, the pool or the output processor: the engine admits what `release` gives.

Sample i of request "r" runs under the internal id "r#i" (`sample_id`); "#" is reserved, so the engine
refuses a caller's request id that contains it and no internal id can clash with another request's.
Outputs carry the parent id "r" and `index` i. With a seed, sample i samples with seed + i.
"""

from __future__ import annotations

from dataclasses import replace

from engine.core.request import Request
from engine.errors import InvalidRequestError
from engine.messages import SamplingParams

MAX_N = 16
SEPARATOR = "#"


def check_n(request_id: str, n: int) -> None:
    """Raises InvalidRequestError for an `n` outside [1, MAX_N] or an id holding the reserved separator."""
    if not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidRequestError(f"n must be in [1, {MAX_N}]; got {n!r}", "n")
    if SEPARATOR in request_id:
        raise InvalidRequestError(
            f"request ids must not contain {SEPARATOR!r} (it names a request's samples): {request_id!r}",
            "request_id",
        )


def sample_id(request_id: str, index: int) -> str:
    return f"{request_id}{SEPARATOR}{index}"


def sample_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sample i's params: seed + i when seeded, so the samples differ yet each one is reproducible."""
    return params if params.seed is None or index == 0 else replace(params, seed=params.seed + index)


class ParallelSampling:
    """The samples of every live n > 1 request. Driven from the engine's step thread only."""

    def __init__(self, hold_back: bool):
        self.hold_back = hold_back  # False without prefix caching: holding back would save nothing
        self._samples: dict[str, list[Request]] = {}  # parent id -> its samples that arrived, by index
        self._held: dict[str, list[Request]] = {}  # parent id -> samples not admitted yet
        # A plain count: add_request reads it from another thread, where iterating _held could race.
        self.num_held = 0

    def arrive(self, request: Request) -> bool:
        """Records a new request; True if the engine admits it now, False if it is held back."""
        if request.parent_id is None:
            return True
        self._samples.setdefault(request.parent_id, []).append(request)
        if request.index == 0 or not self.hold_back:
            return True
        self._held.setdefault(request.parent_id, []).append(request)
        self.num_held += 1
        return False

    def release(self) -> list[Request]:
        """Held samples whose sample 0 has its prompt's KV computed (so cached), or has finished."""
        released = []
        for parent_id in list(self._held):
            first = next((r for r in self._samples[parent_id] if r.index == 0), None)
            # None: sample 0 finished and was forgotten before a sibling was drained from the inbox
            if first is None or first.is_finished or first.num_computed_tokens >= first.num_prompt_tokens:
                released += self._held.pop(parent_id)
        self.num_held -= len(released)
        return released

    def abort(self, parent_id: str) -> tuple[list[Request], list[Request]]:
        """(held samples to admit before aborting them, every sample of the parent)."""
        held = self._held.pop(parent_id, [])
        self.num_held -= len(held)
        return held, list(self._samples.get(parent_id, []))

    def finish(self, request: Request) -> None:
        """Forgets a parent once every sample that arrived has finished and none is held."""
        parent_id = request.parent_id
        if parent_id is None or parent_id in self._held:
            return
        if all(r.is_finished for r in self._samples.get(parent_id, [])):
            self._samples.pop(parent_id, None)
