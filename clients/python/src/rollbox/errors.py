"""Exceptions raised by the Rollbox client.

Every error the service answers is ``{"error": {"code", "message", "field"}}``
with an HTTP status; the client raises the subclass of :class:`RollboxError`
that matches the status, carrying the API's ``code``, ``message`` and
``field`` (the offending field as a path, e.g. ``tasks[0].limits.max_turns``)
and, for 429, 503 and 507, the server's ``Retry-After`` in seconds.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RollboxError",
    "TransportError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "RequestTimeout",
    "Conflict",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "RateLimited",
    "ServerError",
    "ServiceUnavailable",
    "InsufficientStorage",
    "TokenDataUnavailable",
    "ProtocolError",
]


class RollboxError(Exception):
    """An error answered by the service (or, for subclasses noted, by the client).

    Attributes:
        status: the HTTP status (``None`` when no answer came).
        code: the API's error code (``bad_request``, ``not_found``,
            ``overloaded``, ``too_large``, ``episode_ended``,
            ``sandbox_unavailable``, ``shutting_down``, ``recovering``,
            ``insufficient_storage``, ``storage_unavailable``,
            ``unauthorized``, ``forbidden``, ``unsupported_media_type``,
            ``timeout``, ``internal``, ...), or ``None``.
        message: what was wrong, as the service said it.
        field: the offending field as a path, or ``None``.
        retry_after: seconds the service asked to wait (``Retry-After``),
            or ``None``.
        method, url: the request that failed.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        field: str | None = None,
        retry_after: float | None = None,
        method: str | None = None,
        url: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.method = method
        self.url = url
        self.body = body

    def __str__(self) -> str:
        parts = []
        if self.method and self.url:
            parts.append(f"{self.method} {self.url}:")
        if self.status is not None:
            parts.append(f"{self.status}")
        if self.code:
            parts.append(f"{self.code}:")
        if self.field:
            parts.append(f"{self.field}:")
        parts.append(self.message)
        if self.retry_after is not None:
            parts.append(f"(retry after {self.retry_after:g} s)")
        return " ".join(parts)


class TransportError(RollboxError):
    """No answer: the service could not be reached, or the connection broke."""


class ProtocolError(RollboxError):
    """The service answered something the client cannot read (not the API's JSON)."""


class BadRequest(RollboxError):
    """400: bad input; ``field`` names it."""


class Unauthorized(RollboxError):
    """401: a token is required, or the one given is not valid."""


class Forbidden(RollboxError):
    """403: the token may not do this."""


class NotFound(RollboxError):
    """404: no such rollout or episode (or one owned by another tenant)."""


class RequestTimeout(RollboxError):
    """408: the request's body did not arrive in time."""


class Conflict(RollboxError):
    """409: the episode has ended (call finish for its reward), or the rollout has."""


class PayloadTooLarge(RollboxError):
    """413: the body, or tasks × group size, is larger than the service takes."""


class UnsupportedMediaType(RollboxError):
    """415: the body's Content-Type is not the one the route takes."""


class RateLimited(RollboxError):
    """429: the service is full; nothing was queued. ``retry_after`` says when to try again."""


class ServerError(RollboxError):
    """500 (or another 5xx not listed): the service failed."""


class ServiceUnavailable(RollboxError):
    """503: shutting down, recovering, a sandbox could not be made, or storage is unusable."""


class InsufficientStorage(RollboxError):
    """507: the service's data directory is below its free-space reserve; no new work is taken."""


class TokenDataUnavailable(RollboxError):
    """Raised by the client: the episodes hold no token ids (run in chat mode).

    Token-exact data (``input_ids``, ``loss_mask``, ``logprobs``) exists only for
    rollouts submitted with ``policy={"mode": "tokens", ...}`` against a server
    with a tokenizer endpoint (vLLM, SGLang).
    """


_BY_STATUS: dict[int, type[RollboxError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    408: RequestTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: RateLimited,
    503: ServiceUnavailable,
    507: InsufficientStorage,
}


def error_for_status(status: int) -> type[RollboxError]:
    """The exception class for an HTTP status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    return RollboxError
