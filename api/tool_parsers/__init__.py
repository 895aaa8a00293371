"""Tool-call formats by name, and `auto`: the format a chat template's text names.

`make_format(name, tools)` gives a fresh format for one request; api/tool_parsers/extractor.py splits
output text into content and calls with it. No MLX, no Ray.
"""

from __future__ import annotations

from api.tool_parsers.base import ToolFormat, ToolSpec
from api.tool_parsers.deepseek import CALLS_BEGIN, DeepSeekFormat
from api.tool_parsers.hermes import HermesFormat
from api.tool_parsers.llama3 import PYTHON_TAG, Llama3Format
from api.tool_parsers.mistral import MistralFormat
from api.tool_parsers.qwen3_coder import Qwen3CoderFormat

AUTO = "auto"
_FORMATS = {
    "hermes": HermesFormat,
    "qwen3_coder": Qwen3CoderFormat,
    "llama3_json": Llama3Format,
    "mistral": MistralFormat,
    "deepseek": DeepSeekFormat,
}
_ALIASES = {
    "qwen": "hermes",
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "llama3": "llama3_json",
    "deepseek_v3": "deepseek",
}
TOOL_PARSER_NAMES = (AUTO, *_FORMATS, *_ALIASES)


def canonical_name(name: str) -> str:
    """`name` or its alias's target; raises ValueError naming the choices for an unknown one."""
    if name not in TOOL_PARSER_NAMES:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(TOOL_PARSER_NAMES)}")
    return _ALIASES.get(name, name)


def auto_name(template: str) -> str:
    """The format a chat template's text writes calls in. Templates that name none (or render no tools,
    so engine/prompt/chat_template.py describes them in the Hermes format) get `hermes`."""
    if CALLS_BEGIN in template:
        return "deepseek"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<function=" in template and "<tool_call>" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if PYTHON_TAG in template or "respond with a JSON for a function call" in template:
        return "llama3_json"
    return "hermes"


def make_format(name: str, tools: list[ToolSpec]) -> ToolFormat:
    """A format for one request (qwen3_coder types parameter values from `tools`' schemas)."""
    cls = _FORMATS[canonical_name(name)]
    return cls(tools) if cls is Qwen3CoderFormat else cls()


__all__ = [
    "AUTO",
    "TOOL_PARSER_NAMES",
    "ToolFormat",
    "ToolSpec",
    "auto_name",
    "canonical_name",
    "make_format",
]
