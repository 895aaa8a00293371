"""The engine's exception hierarchy. The api/ layer alone maps these to HTTP error JSON and status codes."""

from __future__ import annotations


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
