"""What the client raises: one exception per kind of refusal, each carrying the server's
problem details (`problem.detail`, `problem.errors`), and one for a server that could
not be reached. httpx's own exceptions never leave the client."""

from __future__ import annotations

from memchat.types import ProblemDetails


class MemchatError(Exception):
    """Anything the client raises."""


class ServerUnreachableError(MemchatError):
    """No answer: the connection was refused, timed out or broke mid-answer."""


class UnexpectedAnswerError(MemchatError):
    """A successful answer whose body is not the one the API documents."""


class ApiError(MemchatError):
    """An error answer of the API. `status` is its HTTP status, `problem` its body;
    `retry_after_s` is the server's `Retry-After`, if it sent one."""

    def __init__(self, problem: ProblemDetails, retry_after_s: float | None = None) -> None:
        super().__init__(f"{problem.status} {problem.title}: {problem.detail}")
        self.problem = problem
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        return self.problem.status

    @property
    def detail(self) -> str:
        return self.problem.detail


class BadRequestError(ApiError):
    """400: the body is not JSON, or not UTF-8."""


class AuthenticationError(ApiError):
    """401: no API key, or an unknown or revoked one."""


class PermissionDeniedError(ApiError):
    """403: the key may not do this."""


class NotFoundError(ApiError):
    """404: an unknown session, user, fact or document (or another tenant's)."""


class ConflictError(ApiError):
    """409: the write conflicts with stored data."""


class RequestTooLargeError(ApiError):
    """413: the body, or an import, is over the server's limit."""


class UnsupportedMediaTypeError(ApiError):
    """415: a file kind the knowledge base does not take."""


class InvalidRequestError(ApiError):
    """422: a field breaks a rule; `problem.errors` names each field and rule."""


class RateLimitedError(ApiError):
    """429: the key's rate limit; `retry_after_s` says when to come back."""


class ServiceUnavailableError(ApiError):
    """503: the engine failed or is busy, or a dependency is down; `retry_after_s` says
    when to come back. A streamed turn whose engine fails mid-reply raises it too."""


class ServerError(ApiError):
    """Any other error answer (500 and the like)."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: RequestTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidRequestError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
}


def error_for(problem: ProblemDetails, retry_after_s: float | None = None) -> ApiError:
    """The exception for an error answer, by its status."""
    return _BY_STATUS.get(problem.status, ServerError)(problem, retry_after_s)
