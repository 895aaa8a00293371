"""Reads a JSON request body into a pydantic request model; any failure is a 400 in OpenAI's shape.

Parsing by hand (not as a FastAPI body parameter) keeps malformed JSON, a non-object body and unknown
fields on the one error path of api/errors.py.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from api.errors import from_validation_errors

Body = TypeVar("Body", bound=BaseModel)


async def parse_body(request: Request, model: type[Body]) -> Body:
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors(include_url=False)) from None
