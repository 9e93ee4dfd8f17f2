"""What a refused request is: the kinds of refusal, each with the status and code it is answered with.

Pure data (no HTTP server here): the sans-IO core raises these, and the shells answer them, as JSON
with this status (edge/errors.py), an `error` frame on a WebSocket, or a reply to another replica.
"""

from __future__ import annotations

__all__ = ["HttpError", "Refusal", "refusal"]


class Refusal(Exception):
    """A request the gateway refuses for a reason the caller may read.

    Each kind of refusal says how it is answered, as class attributes (or, for a refusal decided
    at run time such as a limit, instance attributes): SSE and plain HTTP answer it as JSON with
    this status and code, a WebSocket as an `error` frame. The module that raises it owns it.
    """

    status: int = 400
    code: str = "invalid_request"
    # Seconds a client should wait before trying again (a Retry-After header), if it should.
    retry_after: int | None = None

    def public_message(self) -> str:
        return str(self)

    def http(self) -> HttpError:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after else None
        return HttpError(self.status, self.code, self.public_message(), headers)


class HttpError(Refusal):
    """A refusal decided where the request is handled (a route, or the replica it was forwarded to)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def http(self) -> HttpError:
        return self


def refusal(exc: BaseException) -> HttpError | None:
    """The HTTP answer for a refused request (None: not a refusal, a bug)."""
    return exc.http() if isinstance(exc, Refusal) else None
