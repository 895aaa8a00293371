"""Wall time spent inside wrapped methods, by part: the step breakdowns of bench/step_breakdown.py (CPU,
one stream) and bench/gpu_step.py (GPU, a batch)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any


class PartTimer:
    """Wraps methods of live objects (an instance attribute shadows the class's method) and accumulates the
    seconds spent in each under its part's name."""

    def __init__(self, parts: Iterable[str]) -> None:
        self.parts = tuple(parts)
        self.spent = dict.fromkeys(self.parts, 0.0)
        self._wrapped: list[tuple[Any, str]] = []

    def wrap(self, owner: Any, method: str, part: str) -> None:
        original: Callable[..., Any] = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.spent[part] += time.perf_counter() - start

        setattr(owner, method, timed)
        self._wrapped.append((owner, method))

    def reset(self) -> None:
        self.spent = dict.fromkeys(self.parts, 0.0)

    def unwrap(self) -> None:
        """Gives every wrapped object its own method back."""
        for owner, method in reversed(self._wrapped):
            delattr(owner, method)
        self._wrapped.clear()
