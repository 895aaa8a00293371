"""Resolves the configured tool-call and reasoning parsers for the Ingress routes, and sets up one
request's output parsing: `auto` is looked up once from the served model's chat template (via the
Tokenizer). Holds a deployment handle only; no MLX.
"""

from __future__ import annotations

from engine.messages import SamplingParams

from api.output_parser import OutputParsing
from api.tool_choice import ToolChoice, apply, output_parsing
from api.tool_parsers import AUTO, auto_name
from deployments.watched_handle import WatchedHandle


class OutputParsers:
    def __init__(self, tokenizer: WatchedHandle, tool_call_parser: str | None, reasoning_parser: str | None):
        self._tokenizer = tokenizer
        self._tool_call_parser = tool_call_parser
        self._reasoning_parser = reasoning_parser

    async def tool_call_parser(self) -> str | None:
        if self._tool_call_parser == AUTO:
            self._tool_call_parser = auto_name(await self._tokenizer.chat_template_text.remote())
        return self._tool_call_parser

    async def for_request(self, choice: ToolChoice, params: SamplingParams, param: str) -> OutputParsing:
        """The request's parsing; a forcing tool choice becomes `params.structured` (a grammar)."""
        parser = await self.tool_call_parser() if choice.tools and choice.mode != "none" else None
        parsing = output_parsing(choice, parser, self._reasoning_parser)
        apply(choice, parsing, params, param)
        return parsing
