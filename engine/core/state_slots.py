"""The state slots of a model with recurrent, SSM or convolution layers: one slot per running request,
holding that request's layer states (engine/runner/state_storage.py holds the tensors).

Owns which slot each request holds; only the KV cache manager calls it, when it gives a request blocks
and when it frees them (finish, abort, preemption). A preempted request gives its slot back and is
recomputed from token 0, so a slot never needs saving.
"""

from __future__ import annotations

from engine.core.request import Request


class StateSlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, request: Request) -> bool:
        return request.state_slot is not None or bool(self._free)

    def allocate(self, request: Request) -> None:
        if request.state_slot is None:
            request.state_slot = self._free.pop()

    def free(self, request: Request) -> None:
        if request.state_slot is not None:
            self._free.append(request.state_slot)
            request.state_slot = None
