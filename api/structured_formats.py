"""Each dialect's JSON output format -> the engine's neutral `StructuredOutputs`.

Owns the shape checks of OpenAI `response_format` (chat and completions, as vLLM) and vLLM's
`guided_json` / `guided_regex` / `guided_choice` extras, Anthropic
`output_config.format` (and the beta's top-level `output_format`) and the Responses API's
`text.format`. The schema itself is compiled and checked by the engine
(engine/output/structured_output.py), whose error names the parameter. No MLX, no Ray.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from engine.messages import StructuredOutputs

import llguidance

from api.errors import invalid, unsupported

_VLLM_EXTRAS = ("guided_json", "guided_regex", "guided_choice")


class _OpenAIFormats(Protocol):
    response_format: dict[str, Any] | None
    guided_json: dict[str, Any] | str | None
    guided_regex: str | None
    guided_choice: list[str] | None


def openai_structured(req: _OpenAIFormats) -> StructuredOutputs | None:
    """`response_format`, or one of vLLM's guided_* extras; two of them at once are a 400."""
    given = [name for name in _VLLM_EXTRAS if getattr(req, name) is not None]
    if openai_response_format(req.response_format) is not None:
        given.insert(0, "response_format")
    if len(given) > 1:
        raise invalid(given[1], f"give one output constraint; got {', '.join(given)}")
    if not given or given[0] == "response_format":
        return openai_response_format(req.response_format)
    if given[0] == "guided_json":
        return _schema_outputs(_json_schema(req.guided_json), "guided_json", required=True)
    if given[0] == "guided_regex":
        regex = llguidance.regex_to_lark(req.guided_regex or "")
        return StructuredOutputs(grammar=f"start: /{regex}/", param="guided_regex")
    return StructuredOutputs(grammar=_choice_grammar(req.guided_choice or []), param="guided_choice")


def _json_schema(value: dict[str, Any] | str | None) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise invalid(
            "guided_json", f"guided_json is a JSON schema; this string does not parse: {exc}"
        ) from exc


def _choice_grammar(choices: list[str]) -> str:
    if not choices:
        raise invalid("guided_choice", "guided_choice needs at least one choice")
    return "start: " + " | ".join(json.dumps(choice) for choice in choices)  # Lark strings are JSON strings


def openai_response_format(
    fmt: dict[str, Any] | None, param: str = "response_format"
) -> StructuredOutputs | None:
    """`{type: text | json_object | json_schema, json_schema: {name, schema, strict}}`; None: free text."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputs(json_object=True, param=param)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise invalid(
                f"{param}.json_schema", "a json_schema response format needs a 'json_schema' object"
            )
        return _schema_outputs(spec.get("schema"), f"{param}.json_schema.schema")
    if kind in ("structural_tag", "grammar", "regex"):
        raise unsupported(param, f"response_format type {kind!r} is not implemented")
    raise invalid(
        f"{param}.type", f"response_format type is 'text', 'json_object' or 'json_schema'; got {kind!r}"
    )


def responses_text_format(fmt: dict[str, Any] | None) -> StructuredOutputs | None:
    """The Responses API flattens the schema: `{type: json_schema, name, schema, strict}`."""
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return StructuredOutputs(json_object=True, param="text.format")
    if fmt.get("type") == "json_schema":
        return _schema_outputs(fmt.get("schema"), "text.format.schema")
    raise invalid(
        "text.format.type",
        f"text.format type is 'text', 'json_object' or 'json_schema'; got {fmt.get('type')!r}",
    )


def anthropic_output_format(
    output_config: dict[str, Any] | None, output_format: dict[str, Any] | None
) -> StructuredOutputs | None:
    """`output_config: {format: {type: json_schema, schema}}`, or the beta's `output_format` of that shape."""
    config = dict(output_config or {})
    if config.get("effort") is not None:
        raise unsupported("output_config.effort", "effort levels are not implemented")
    config.pop("effort", None)
    fmt, param = config.pop("format", None), "output_config.format"
    if config:
        raise unsupported(f"output_config.{next(iter(config))}", "not implemented by this server")
    if output_format is not None:
        if fmt is not None:
            raise invalid("output_format", "give the format once: output_config.format or output_format")
        fmt, param = output_format, "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise invalid(f"{param}.type", "the only output format type is 'json_schema'")
    return _schema_outputs(fmt.get("schema"), f"{param}.schema", required=True)


def _schema_outputs(schema: Any, param: str, required: bool = False) -> StructuredOutputs:
    """`param`: where the schema is in the request; the engine's errors about it name this."""
    if schema is None and not required:
        # A json_schema format without a schema: any JSON object.
        return StructuredOutputs(json_object=True, param=param)
    if not isinstance(schema, dict):
        raise invalid(param, f"the JSON schema must be an object; got {type(schema).__name__}")
    return StructuredOutputs(json_schema=schema, param=param)
