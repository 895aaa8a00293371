"""OpenAPI for routes that read raw JSON bodies: declares each body's pydantic schema.

The routes parse `Request` bodies by hand (api/body.py keeps every failure on one error path), so
FastAPI cannot see their bodies; `request_body(Model)` goes into a route's `openapi_extra` and
`install_openapi(app)` lifts the models' schemas into `components.schemas`. No Ray, no MLX.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

_SCHEMAS_KEY = "x-body-schemas"  # carries the schemas from a route to the document; removed there


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions = schema.pop("$defs", {})
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
        _SCHEMAS_KEY: {**definitions, model.__name__: schema},
    }


def install_openapi(app: FastAPI) -> None:
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _lift_schemas(build())  # build() caches the document in app.openapi_schema
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _lift_schemas(document: dict[str, Any]) -> None:
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            for name, schema in operation.pop(_SCHEMAS_KEY, {}).items():
                if schemas.setdefault(name, schema) != schema:
                    raise ValueError(f"two request models define the schema {name!r}; rename one of them")
