"""Reads a JSON request body into a pydantic request model; any failure is a 400 in OpenAI's shape.

Parsing by hand (not as a FastAPI body parameter) keeps malformed JSON, a non-object body and unknown
fields on the one error path of api/errors.py. Owns the rule for unknown top-level fields
(`UnknownFields`); nested objects keep their schemas' own rule (unknown keys there are a 400).
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from api.errors import from_validation_errors

logger = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)


class UnknownFields:
    """Top-level fields that no schema names. Lenient (the default): accepted, left unread and logged once
    per route and name, since OpenAI's and Anthropic's APIs add fields every week and a field the server
    has never heard of cannot be one it claims to honour. Strict (`strict_request_fields: true`): a 400
    naming the field, for operators who want every field a client sends to be one the server knows."""

    def __init__(self, strict: bool = False):
        self.strict = strict
        self._logged: set[tuple[str, str]] = set()

    def check(self, body: BaseModel, route: str) -> None:
        extra: dict[str, Any] = body.model_extra or {}
        if not extra:
            return
        if self.strict:
            first = next(iter(extra))
            raise from_validation_errors([{"type": "extra_forbidden", "loc": (first,), "msg": ""}])
        for name in extra:
            if (route, name) not in self._logged:
                self._logged.add((route, name))
                logger.warning("%s: unknown request field %r accepted and ignored (logged once)", route, name)

    def seen(self) -> list[tuple[str, str]]:
        """(route, field) pairs accepted so far, in the order first seen."""
        return list(self._logged)


def _unknown_names(raw: bytes, model: type[BaseModel]) -> list[str]:
    """Strict mode names an unknown field before whatever else failed: it is usually the cause."""
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [name for name in value if name not in model.model_fields] if isinstance(value, dict) else []


async def parse_body(request: Request, model: type[Body], unknown_fields: UnknownFields) -> Body:
    raw = await request.body()
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        if unknown_fields.strict and (names := _unknown_names(raw, model)):
            exc_errors: list[Any] = [{"type": "extra_forbidden", "loc": (names[0],), "msg": ""}]
        else:
            exc_errors = list(exc.errors(include_url=False))
        raise from_validation_errors(exc_errors) from None
    unknown_fields.check(body, request.url.path)
    return body
