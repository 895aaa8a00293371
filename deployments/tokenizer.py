"""Tokenizer deployment: the served model's tokenizer alone (no weights), for the Ingress.

Owns chat templating (with engine/prompt/chat_template.py's fallback for templates without tool support),
prompt encoding, token counting and token texts for logprobs; for a vision-language model also the
images (engine/prompt/image_processor.py, run in a worker thread). A request the template or tokenizer
cannot take comes back as an `InvalidRequestError` value, not a raise.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.messages import ImageInputs
from engine.models.model_loader import load_image_preprocessor
from engine.prompt.chat_template import (
    add_tools_prompt,
    flatten_tool_turns,
    needs_flattening,
    renders_tool_calls,
    renders_tools,
    template_source,
)
from engine.prompt.image_processor import as_content_parts

from jinja2 import TemplateError
from ray import serve

logger = logging.getLogger(__name__)


@serve.deployment
class Tokenizer:
    def __init__(self, engine_config: dict[str, Any]):
        # Imported here, not at the top: only this replica's process needs MLX and the model code.
        from engine.models.model_loader import load_tokenizer

        config = EngineConfig.model_validate(engine_config)
        self._tokenizer = load_tokenizer(config)
        self._images = load_image_preprocessor(config, self._tokenizer)  # None: a text-only model

    async def chat_prompt_ids(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int] | InvalidRequestError:
        """Renders the chat template and encodes it; the template adds any BOS it wants.

        `continue_final_message` leaves the last (assistant) turn open, so generation continues it."""
        text = self._render(messages, add_generation_prompt, tools, continue_final_message, template_kwargs)
        if isinstance(text, InvalidRequestError):
            return text
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    async def chat_prompt_inputs(
        self,
        messages: list[dict[str, Any]],
        images: list[bytes],
        max_image_pixels: int,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[int], ImageInputs] | InvalidRequestError:
        """Like `chat_prompt_ids`, for messages with image parts: the images' bytes (in prompt order) are
        decoded and processed off this replica's event loop; the ids carry the expanded image tokens."""
        if self._images is None:
            return InvalidRequestError("this model accepts no images; send text only", "messages")
        text = self._render(messages, add_generation_prompt, tools, continue_final_message, template_kwargs)
        if isinstance(text, InvalidRequestError):
            return text
        try:
            return await asyncio.to_thread(self._images.process, text, images, max_image_pixels)
        except InvalidRequestError as exc:
            return exc

    def _render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
        continue_final_message: bool,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str | InvalidRequestError:
        if self._images is not None:
            messages = as_content_parts(messages)
        if not getattr(self._tokenizer, "has_chat_template", True):
            return InvalidRequestError("this model has no chat template; use /v1/completions", "messages")
        source = template_source(self._tokenizer)
        if needs_flattening(messages) and not renders_tool_calls(source):
            messages = flatten_tool_turns(messages)
        if tools and not renders_tools(source):
            messages, tools = add_tools_prompt(messages, tools), None
        kwargs: dict[str, Any] = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
        if continue_final_message:
            kwargs["continue_final_message"] = True
        try:
            text: str = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
            )
        except (TemplateError, ValueError) as exc:  # templates raise on messages they refuse (role order)
            return InvalidRequestError(f"the chat template rejected the messages: {exc}", "messages")
        return text

    async def encode(self, texts: list[str]) -> list[list[int]]:
        """Plain prompts -> token ids, with the tokenizer's own special tokens (BOS if it adds one)."""
        return [list(self._tokenizer.encode(text)) for text in texts]

    async def count_tokens(self, texts: list[str]) -> int:
        return sum(len(ids) for ids in await self.encode(texts))

    async def token_texts(self, token_ids: list[int]) -> dict[int, str]:
        """Each id's own text (as a client sees it in logprobs): decoded alone, specials kept."""
        return {i: self._tokenizer.decode([i], skip_special_tokens=False) for i in token_ids}

    async def chat_template_text(self) -> str:
        """The template's source, for picking the `auto` tool-call parser."""
        return template_source(self._tokenizer)

    async def eos_token_ids(self) -> list[int]:
        return sorted(self._tokenizer.eos_token_ids)
