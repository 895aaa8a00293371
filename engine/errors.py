"""The engine's exception hierarchy. The api/ layer alone maps these to HTTP error JSON and status codes."""

from __future__ import annotations

from pathlib import Path


class EngineError(Exception):
    """Base of every error the engine raises at its boundary."""

    code = "engine_error"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(EngineError):
    """The request cannot be served as given; the message says what to change."""

    code = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    code = "context_length_exceeded"


class QueueFullError(EngineError):
    """The waiting queue is at its bound; the client should retry later."""

    code = "queue_full"


class RequestFailedError(EngineError):
    """One request failed while running (for example its sampling raised); others go on."""

    code = "request_failed"


class ModelLoadError(EngineError):
    """The configured model could not be loaded; the message names it, the cause and what to change."""

    code = "model_load_failed"


def load_cause(model: str, exc: Exception) -> str:
    """Why `model` did not load, in one line: a missing directory says so (the loaders would go on to
    read the path as a hub id and complain about its form), anything else is the exception's text."""
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        return "no such directory"
    return f"{type(exc).__name__}: {str(exc).rstrip('.')}"
