"""OpenAI requests -> the engine's neutral inputs: chat messages or prompts plus `SamplingParams`.

Owns which OpenAI parameters are honoured: anything parsed but not honoured is answered with a 400
naming the parameter, never dropped. The reverse direction lives in api/openai_outputs.py.
No Ray, no MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.core.parallel_sampling import MAX_N
from engine.messages import SamplingParams

from api.errors import invalid, model_not_found, unsupported
from api.openai_schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ContentPart,
    EmbeddingRequest,
    _SamplingFields,
)
from api.openai_tools import template_calls, template_tools
from api.structured_formats import openai_structured
from api.template_messages import ChatPrompt, image_part, parts_turn, text_part
from api.tool_choice import ToolChoice

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_MODEL_ALIAS = "default"


def resolve_model(requested: str, model_name: str, served_model_name: str | None) -> str:
    """Checks `model` and returns the name to echo in responses (the served alias if configured)."""
    accepted = [DEFAULT_MODEL_ALIAS, model_name] + ([served_model_name] if served_model_name else [])
    if requested not in accepted:
        raise model_not_found(requested, accepted[1:])
    return served_model_name or model_name


# --- checks: parameters we parse but do not honour ---------------------------------------------


def check_chat_supported(req: ChatCompletionRequest) -> None:
    _check_common(req)
    if req.functions is not None or req.function_call is not None:
        param = "functions" if req.functions is not None else "function_call"
        raise unsupported(
            param, "the legacy function-calling fields are not served; send tools and tool_choice"
        )
    if req.audio is not None:
        raise unsupported("audio", "this server produces no audio")
    if req.modalities not in (None, ["text"]):
        raise unsupported("modalities", "only ['text'] output is served")
    template_kwargs(req)  # reserved names are a 400 before any tokenizing
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true")
    for i, message in enumerate(req.messages):
        _check_message(i, message)


def check_completion_supported(req: CompletionRequest) -> None:
    _check_common(req)
    if req.best_of not in (None, samples_per_prompt(req)):
        raise unsupported("best_of", "only best_of equal to n is served (every sample is returned)")
    if req.echo:
        raise unsupported("echo", "echoing the prompt is not implemented")
    if req.suffix:
        raise unsupported("suffix", "insertion (suffix) is not implemented")


def _check_common(req: _SamplingFields) -> None:
    if req.n is not None and not 1 <= req.n <= MAX_N:
        raise unsupported("n", f"at most n={MAX_N} choices per prompt are served; send several requests")
    openai_structured(req)  # a malformed format is a 400 before any tokenizing
    if req.stream_options is not None and not req.stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")


def _check_message(i: int, message: ChatMessage) -> None:
    for param in ("function_call", "audio"):
        if getattr(message, param) is not None:
            raise unsupported(f"messages[{i}].{param}", "use tool_calls; audio is not implemented")
    if message.tool_calls and message.role != "assistant":
        raise invalid(f"messages[{i}].tool_calls", "only assistant messages carry tool_calls")
    if isinstance(message.content, list):
        for j, part in enumerate(message.content):
            if part.type == "image_url" and message.role == "user":
                _check_image_part(f"messages[{i}].content[{j}]", part)
            elif part.type != "text" or part.text is None:
                raise unsupported(
                    f"messages[{i}].content[{j}]",
                    f"only text and (in user turns) image_url parts are served, not {part.type!r}",
                )


def _check_image_part(where: str, part: ContentPart) -> None:
    image = part.image_url or {}
    if not isinstance(image.get("url"), str) or not image["url"]:
        raise invalid(
            f"{where}.image_url.url", f"{where}: an image_url part needs image_url.url, a URL string"
        )
    if image.get("detail") not in (None, "auto"):
        raise unsupported(f"{where}.image_url.detail", "the model's processor sets the detail; send 'auto'")
    if set(image) - {"url", "detail"}:
        raise invalid(f"{where}.image_url", f"{where}.image_url takes only 'url' and 'detail'")


# --- prompts -----------------------------------------------------------------------------------


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as plain dicts for the chat template; `developer` is the newer name of `system`."""
    return [_template_message(i, message) for i, message in enumerate(req.messages)]


def chat_image_urls(req: ChatCompletionRequest) -> list[str]:
    """The image URLs of every image_url part, in prompt order (checked by check_chat_supported)."""
    return [
        part.image_url["url"]  # type: ignore[index]
        for message in req.messages
        if isinstance(message.content, list)
        for part in message.content
        if part.type == "image_url"
    ]


def _template_message(i: int, message: ChatMessage) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    content = message.content
    if isinstance(content, list):
        parts = [image_part() if p.type == "image_url" else text_part(p.text or "") for p in content]
        out = parts_turn(role, parts)
    else:
        out = {"role": role, "content": content or ""}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = template_calls(i, message.tool_calls)
    return out


def chat_prompt(req: ChatCompletionRequest, choice: ToolChoice) -> ChatPrompt:
    """What the Tokenizer renders for a chat completion; vLLM's `add_generation_prompt` may leave the
    assistant turn unopened."""
    opens_turn = True if req.add_generation_prompt is None else req.add_generation_prompt
    image_urls = tuple(chat_image_urls(req))
    return ChatPrompt(
        chat_messages(req),
        template_tools(choice),
        image_urls=image_urls,
        opens_turn=opens_turn,
        template_kwargs=template_kwargs(req),
    )


# Set by the server from the request's own fields; a template variable of the same name would fight them.
_RESERVED_TEMPLATE_VARS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "tokenize"}
)


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """`chat_template_kwargs`, plus `reasoning_effort` as the variable gpt-oss-style templates read."""
    extra = dict(req.chat_template_kwargs or {})
    if reserved := sorted(_RESERVED_TEMPLATE_VARS & set(extra)):
        raise invalid(
            f"chat_template_kwargs.{reserved[0]}",
            f"chat_template_kwargs may not set {reserved}: the server sets them from the request's fields",
        )
    if req.reasoning_effort is not None:
        extra.setdefault("reasoning_effort", req.reasoning_effort)
    return extra


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """One entry per choice: a string to encode, or token ids to use as they are."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise invalid("prompt", "'prompt' must not be an empty list")
    if all(isinstance(item, int) for item in prompt):
        return [[item for item in prompt if isinstance(item, int)]]  # one prompt of token ids
    prompts: list[str | list[int]] = []
    for i, item in enumerate(prompt):
        if isinstance(item, list) and not item:
            raise invalid(f"prompt[{i}]", "a token-id prompt must not be empty")
        if isinstance(item, str | list):
            prompts.append(item)
    return prompts


def embedding_inputs(req: EmbeddingRequest) -> list[str] | list[list[int]]:
    """Always a list: one entry per vector wanted."""
    data = req.input
    if isinstance(data, str):
        return [data]
    if not data:
        raise invalid("input", "'input' must not be an empty list")
    if all(isinstance(item, int) for item in data):
        return [[item for item in data if isinstance(item, int)]]  # one input of token ids
    if all(isinstance(item, str) for item in data):
        return [item for item in data if isinstance(item, str)]
    return [item for item in data if isinstance(item, list)]


# --- sampling ----------------------------------------------------------------------------------


def chat_sampling_params(req: ChatCompletionRequest) -> SamplingParams:
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _sampling_params(req, max_tokens, logprobs)


def completion_sampling_params(req: CompletionRequest) -> SamplingParams:
    max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    return _sampling_params(req, max_tokens, req.logprobs)


def _sampling_params(req: _SamplingFields, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=req.min_tokens or 0,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=None if req.top_k in (None, -1, 0) else req.top_k,
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=_logit_bias(req.logit_bias),
        seed=req.seed,
        stop=_stop_list(req.stop),
        stop_token_ids=list(req.stop_token_ids or []),
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        ignore_eos=bool(req.ignore_eos),
        logprobs=logprobs,
        skip_special_tokens=True if req.skip_special_tokens is None else req.skip_special_tokens,
        structured=openai_structured(req),
    )


def _stop_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if any(not s for s in stops):
        raise invalid("stop", "stop strings must not be empty")
    return stops


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not key.lstrip("-").isdigit() or int(key) < 0:
            raise invalid("logit_bias", f"logit_bias keys are token ids; {key!r} is not one")
        if not -100.0 <= value <= 100.0:
            raise invalid("logit_bias", f"logit_bias values lie in [-100, 100]; got {value} for {key}")
        out[int(key)] = value
    return out


def samples_per_prompt(req: _SamplingFields) -> int:
    """`n`: the choices sampled from each prompt, which share the prompt's KV in the engine."""
    return 1 if req.n is None else req.n


def include_usage(req: _SamplingFields) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)
