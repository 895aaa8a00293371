"""One request's state inside the engine: its tokens, its progress and the ids of its KV blocks.

The request holds block ids only; the block pool owns the blocks. Counting follows one rule:
`num_computed_tokens` of `num_tokens` have KV in the cache; a step computes some of the difference.
`num_tokens` counts pending tokens too: sampled by a launched step whose result is not read yet.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.core.vision_state import VisionState
from engine.messages import FinishReason, SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: params.max_tokens or what fits in max_model_len
    arrival_s: float = field(default_factory=time.monotonic)
    all_token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chain hashes of this request's full blocks
    state_slot: int | None = None  # its recurrent layers' state (engine/core/state_slots.py); None: none held
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    token_gap_s: float | None = None  # between the last two output tokens; None until there are two
    num_preemptions: int = 0
    vision: VisionState | None = None  # images of a VLM request (engine/core/vision_state.py)
    num_pending_tokens: int = 0  # sampled on the device by a launched step, not yet in all_token_ids
    parent_id: str | None = None  # the GenerateRequest's id when this is one of its n > 1 samples
    index: int = 0  # which sample of its parent (engine/core/parallel_sampling.py)
    # The model attends bidirectionally over the prompt (PaliGemma's prefix-LM): the prompt is computed
    # in one chunk, and any token after it (a recompute's outputs) one per step.
    prefill_whole: bool = False
    # Speculative decoding (engine/spec_decode/): tokens a drafter proposed after the last known one,
    # verified by the next step that schedules them; and how many leading positions of the draft
    # model's cache hold this request's actual tokens.
    spec_token_ids: list[int] = field(default_factory=list)
    draft_frontier: int = 0

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        self._output_token_ids: list[int] = []  # all_token_ids past the prompt, kept as they are appended

    @property
    def external_id(self) -> str:
        """The id the caller gave: outputs carry it, with `index` telling the samples apart."""
        return self.parent_id if self.parent_id is not None else self.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids) + self.num_pending_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def num_known_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """The outputs so far: the request's own list, not a copy (a step reads it for every row)."""
        return self._output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        now = time.monotonic()
        if self.first_token_s is None:
            self.first_token_s = now
        else:
            self.token_gap_s = now - self.last_token_s  # type: ignore[operator]
        self.last_token_s = now
        self.all_token_ids.append(token_id)
        self._output_token_ids.append(token_id)
