"""Parsed output events -> Responses output items (reasoning, message, function_call) in the order the
model produced them, with each item's stream events.

Owns item ids, output indexes and the per-item event sequences: output_item.added, the content part and
its deltas (output_text / reasoning_text) or function_call_arguments deltas, their .done events and
output_item.done. The same builder makes a whole response's `output` (its frames unused), so a streamed
response ends equal to the non-streamed one. Whitespace-only text between items opens no message. A
call to a namespace tool's flattened name is reported under its own name and namespace.
No Ray, no MLX.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from api.choice_state import ChoiceState
from api.output_parser import OutputEvent, OutputParser, OutputParsing, ReasoningDelta
from api.responses_outputs import (
    FunctionCallOut,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningOut,
    ReasoningPart,
    ResponseMeta,
    Status,
    final_status,
)
from api.responses_tools import ToolNames, flat_name
from api.template_messages import Message, assistant_turn, tool_call
from api.tool_parsers.extractor import ArgumentsDelta, CallStart, TextDelta

Frame = Callable[..., str]  # (event name, **fields) -> one numbered SSE frame


def _no_frame(name: str, **fields: Any) -> str:
    return ""


class OutputItems:
    """`parallel` False keeps the first function call only (OpenAI returns at most one then); `names`
    maps the flattened names of namespace tools back."""

    def __init__(
        self,
        meta: ResponseMeta,
        event: Frame = _no_frame,
        parallel: bool = True,
        names: ToolNames | None = None,
    ):
        self._meta = meta
        self._event = event
        self._parallel = parallel
        self._names = names or ToolNames()
        self.output: list[OutputItem] = []
        self._open: OutputItem | None = None
        self._pending = ""  # whitespace-only text not yet in any message
        self._calls: dict[int, FunctionCallOut] = {}  # by the extractor's call index

    def frames(self, events: list[OutputEvent]) -> list[str]:
        out: list[str] = []
        for item in events:
            if isinstance(item, ReasoningDelta):
                out += self._reasoning(item.text)
            elif isinstance(item, TextDelta):
                out += self._text(item.text)
            elif isinstance(item, CallStart) and (self._parallel or item.index == 0):
                out += self._call_start(item)
            elif isinstance(item, ArgumentsDelta) and item.index in self._calls:
                out += self._arguments(self._calls[item.index], item.text)
        return out

    def close(self, status: Status) -> list[str]:
        """Ends the open item with `status`; an output with no message and no call gets one message."""
        if not any(isinstance(item, (OutputMessage, FunctionCallOut)) for item in self.output):
            out = self._close_open(status) + self._open_message()
            out += self._text_delta(self._pending) if self._pending else []
            self._pending = ""
            return out + self._close_open(status)
        return self._close_open(status)

    # --- items -----------------------------------------------------------------------------------

    def _reasoning(self, text: str) -> list[str]:
        out: list[str] = []
        if not isinstance(self._open, ReasoningOut):
            item = ReasoningOut(id=f"rs_{uuid.uuid4().hex}", content=[], status="in_progress")
            out = self._add(item) + [self._part_event("added", item, ReasoningPart(text=""))]
        assert isinstance(self._open, ReasoningOut)
        self._open.content[0].text += text
        fields = self._part_fields(self._open)
        return out + [self._event("response.reasoning_text.delta", **fields, delta=text)]

    def _text(self, text: str) -> list[str]:
        if isinstance(self._open, OutputMessage):
            return self._text_delta(text)
        self._pending += text
        if not self._pending.strip():
            return []
        text, self._pending = self._pending, ""
        return self._open_message() + self._text_delta(text)

    def _open_message(self) -> list[str]:
        first = not any(isinstance(item, OutputMessage) for item in self.output)
        item_id = self._meta.item_id if first else f"msg_{uuid.uuid4().hex}"
        item = OutputMessage(id=item_id, status="in_progress", content=[])
        return self._add(item) + [self._part_event("added", item, OutputText(text=""))]

    def _text_delta(self, text: str) -> list[str]:
        assert isinstance(self._open, OutputMessage)
        self._open.content[0].text += text
        fields = self._part_fields(self._open)
        return [self._event("response.output_text.delta", **fields, delta=text, logprobs=[])]

    def _call_start(self, start: CallStart) -> list[str]:
        self._pending = ""
        item_id = "fc_" + start.id.removeprefix("call_")
        namespace, name = self._names.original(start.name)
        item = FunctionCallOut(
            id=item_id, call_id=start.id, name=name, namespace=namespace, arguments="", status="in_progress"
        )
        self._calls[start.index] = item
        return self._add(item)

    def _arguments(self, item: FunctionCallOut, text: str) -> list[str]:
        item.arguments += text
        index = self.output.index(item)
        fields = {"item_id": item.id, "output_index": index}
        return [self._event("response.function_call_arguments.delta", **fields, delta=text)]

    # --- opening and closing ---------------------------------------------------------------------

    def _add(self, item: OutputItem) -> list[str]:
        out = self._close_open("completed")
        self.output.append(item)
        self._open = item
        index = len(self.output) - 1
        return out + [self._event("response.output_item.added", output_index=index, item=item.model_dump())]

    def _close_open(self, status: Status) -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        out = self._done_events(item)
        item.status = status
        index = self.output.index(item)
        return out + [self._event("response.output_item.done", output_index=index, item=item.model_dump())]

    def _done_events(self, item: OutputItem) -> list[str]:
        if isinstance(item, FunctionCallOut):
            fields = {"item_id": item.id, "output_index": self.output.index(item)}
            return [self._event("response.function_call_arguments.done", **fields, arguments=item.arguments)]
        part = item.content[0]
        if isinstance(item, ReasoningOut):
            done = self._event("response.reasoning_text.done", **self._part_fields(item), text=part.text)
        else:
            fields = self._part_fields(item)
            done = self._event("response.output_text.done", **fields, text=part.text, logprobs=[])
        return [done, self._part_event("done", item, part)]

    def _part_event(
        self, which: str, item: OutputMessage | ReasoningOut, part: OutputText | ReasoningPart
    ) -> str:
        if which == "added":
            item.content.append(part.model_copy())  # type: ignore[arg-type]
        fields = self._part_fields(item)
        return self._event(f"response.content_part.{which}", **fields, part=part.model_dump())

    def _part_fields(self, item: OutputItem) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": self.output.index(item), "content_index": 0}


def whole_output(
    meta: ResponseMeta,
    state: ChoiceState,
    parsing: OutputParsing,
    parallel: bool = True,
    names: ToolNames | None = None,
) -> list[OutputItem]:
    """A finished output's items, read as a whole (no stream)."""
    parser = OutputParser(parsing, stream=False)
    items = OutputItems(meta, parallel=parallel, names=names)
    items.frames(parser.feed(state.text) + parser.finish())
    items.close(final_status(state))
    return items.output


def assistant_turns(output: list[OutputItem]) -> list[Message]:
    """The response as the chat-template turn a follow-up (previous_response_id) continues from: calls
    under the names the model saw."""
    text = "".join(item.content[0].text for item in output if isinstance(item, OutputMessage))
    calls = [
        tool_call(i.call_id, flat_name(i.namespace, i.name), _arguments(i.arguments))
        for i in output
        if isinstance(i, FunctionCallOut)
    ]
    turn = assistant_turn(text, calls)
    reasoning = "".join(part.text for i in output if isinstance(i, ReasoningOut) for part in i.content)
    if reasoning:
        turn["reasoning_content"] = reasoning
    return [turn]


def _arguments(text: str) -> dict[str, Any]:
    """A call cut short by max_output_tokens has no JSON object: its turn carries no arguments."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
