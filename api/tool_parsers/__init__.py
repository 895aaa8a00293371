"""Tool-call formats by name, and `auto`: the format a chat template's text names.

`make_format(name, tools)` gives a fresh format for one request; api/tool_parsers/extractor.py splits
output text into content and calls with it. No MLX, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable

from api.tool_parsers.base import ToolFormat, ToolSpec
from api.tool_parsers.deepseek import CALLS_BEGIN, DeepSeekFormat
from api.tool_parsers.glm45 import Glm45Format
from api.tool_parsers.gpt_oss import CALL, CHANNEL, HarmonyFormat
from api.tool_parsers.hermes import HermesFormat
from api.tool_parsers.kimi_k2 import SECTION_BEGIN, KimiK2Format
from api.tool_parsers.lfm2 import Lfm2Format
from api.tool_parsers.llama3 import PYTHON_TAG, Llama3Format
from api.tool_parsers.minimax_m2 import MiniMaxM2Format
from api.tool_parsers.mistral import MistralFormat
from api.tool_parsers.nemotron import NemotronFormat
from api.tool_parsers.qwen3_coder import Qwen3CoderFormat

AUTO = "auto"
_FORMATS: dict[str, Callable[[], ToolFormat]] = {
    "hermes": HermesFormat,
    "qwen3_coder": Qwen3CoderFormat,
    "llama3_json": Llama3Format,
    "mistral": MistralFormat,
    "deepseek": DeepSeekFormat,
    "glm45": Glm45Format,
    "kimi_k2": KimiK2Format,
    "minimax_m2": MiniMaxM2Format,
    "nemotron": NemotronFormat,
    "lfm2": Lfm2Format,
    "openai": HarmonyFormat,
}
_ALIASES = {
    "qwen": "hermes",
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "llama3": "llama3_json",
    "deepseek_v3": "deepseek",
    "granite4": "hermes",
    "qwen3_5": "qwen3_coder",
    "qwen3_next": "qwen3_coder",
    "glm47": "glm45",
    "nemotron_h": "nemotron",
    "gpt_oss": "openai",
    "harmony": "openai",
}
# Template strings that name a format, checked in order before the generic `<tool_call>` rules.
_TEMPLATE_MARKERS = (
    (CALLS_BEGIN, "deepseek"),
    (SECTION_BEGIN, "kimi_k2"),
    ("<minimax:tool_call>", "minimax_m2"),
    ("<TOOLCALL>", "nemotron"),
    ("<|tool_call_start|>", "lfm2"),
    ("<|tool_list_start|>", "lfm2"),
    ("[TOOL_CALLS]", "mistral"),
    ("<arg_key>", "glm45"),
)
# Formats that type parameter values from the request's tool schemas.
_SCHEMA_TYPED: dict[str, Callable[[list[ToolSpec]], ToolFormat]] = {
    "qwen3_coder": Qwen3CoderFormat,
    "glm45": Glm45Format,
    "minimax_m2": MiniMaxM2Format,
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
    if CHANNEL in template and CALL in template:  # gpt-oss's Harmony
        return "openai"
    for marker, name in _TEMPLATE_MARKERS:
        if marker in template:
            return name
    if "<function=" in template and "<tool_call>" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if PYTHON_TAG in template or "respond with a JSON for a function call" in template:
        return "llama3_json"
    return "hermes"


def make_format(name: str, tools: list[ToolSpec]) -> ToolFormat:
    """A format for one request (qwen3_coder, glm45 and minimax_m2 type values from `tools`' schemas)."""
    name = canonical_name(name)
    typed = _SCHEMA_TYPED.get(name)
    return typed(tools) if typed is not None else _FORMATS[name]()


__all__ = [
    "AUTO",
    "TOOL_PARSER_NAMES",
    "ToolFormat",
    "ToolSpec",
    "auto_name",
    "canonical_name",
    "make_format",
]
