"""The only place where errors become HTTP: RFC 9457 problem details for every failure."""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.response import Redirect

from app.access.rate_limits import RateLimiterUnavailableError
from retrieval.errors import (
    EmbeddingModelMismatchError,
    EngineBusyError,
    EngineError,
    IndexUnavailableError,
    InvalidInputError,
    SessionBusyError,
    TooLargeError,
    UnsupportedDocumentError,
)
from storage.errors import (
    ConflictError,
    DatabaseUnavailableError,
    InvalidDataError,
    NotFoundError,
)

log = structlog.get_logger(__name__)

PROBLEM_JSON = "application/problem+json"
_MSGSPEC_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`")
_MSGSPEC_FIELD = re.compile(r"(?:unknown|missing required) field `(?P<name>[^`]+)`")
# msgspec quotes a refused pattern whole; the id pattern is long and says little that way.
_LONG_PATTERN = re.compile(r"Expected `str` matching regex '.{60,}'")
ID_RULE = "Expected an id without '/', control or invisible characters or a space at either end"


def _readable(message: str) -> str:
    return _LONG_PATTERN.sub(ID_RULE, message)


def problem_body(
    status: int, detail: str, instance: str, errors: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors:
        body["errors"] = errors
    return body


def problem(
    request: Request[Any, Any, Any],
    status: int,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response[dict[str, Any]]:
    body = problem_body(status, detail, request.url.path, errors)
    return Response(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field_of(message: str, item: dict[str, Any]) -> str:
    """The dotted path of the offending field, from msgspec's message or Litestar's key."""
    path_match = _MSGSPEC_PATH.search(message)
    path = path_match.group("path") if path_match else str(item.get("key") or "")
    if path == "data":
        path = ""
    if name_match := _MSGSPEC_FIELD.search(message):
        return f"{path}.{name_match.group('name')}" if path else name_match.group("name")
    return path or "body"


def _field_errors(exc: ValidationException) -> list[dict[str, str]]:
    """Litestar reports msgspec errors as 'Expected ... - at `$.field`'; name the field."""
    found: list[dict[str, str]] = []
    extra = exc.extra if isinstance(exc.extra, list) else []
    for item in extra:
        if not isinstance(item, dict):
            continue
        message = str(item.get("message", ""))
        text = _readable(_MSGSPEC_PATH.sub("", message))
        found.append({"field": _field_of(message, item), "message": text})
    return found


class BadBodyError(Exception):
    """A request body that is not JSON (400), not sent as JSON (415), too large (413) or
    not of the documented shape (422)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def on_bad_body(request: Request[Any, Any, Any], exc: BadBodyError) -> Response[Any]:
    if exc.status in (400, 413, 415):
        return problem(request, exc.status, exc.message)
    error = {
        "field": _field_of(exc.message, {}),
        "message": _readable(_MSGSPEC_PATH.sub("", exc.message)),
    }
    return problem(
        request, 422, f"invalid request: {error['field']}: {error['message']}", errors=[error]
    )


def on_validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    errors = _field_errors(exc)
    if not errors:
        # Not a field problem: the body is not JSON at all, or not decodable.
        return problem(request, 400, exc.detail or "malformed request body")
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return problem(request, 422, f"invalid request: {summary}", errors=errors)


def on_invalid_input(request: Request[Any, Any, Any], exc: InvalidInputError) -> Response[Any]:
    return problem(
        request,
        422,
        f"{exc.field}: {exc.message}",
        errors=[{"field": exc.field, "message": exc.message}],
    )


def _input_problem(
    request: Request[Any, Any, Any], status: int, exc: InvalidInputError
) -> Response[Any]:
    errors = [{"field": exc.field, "message": exc.message}]
    return problem(request, status, f"{exc.field}: {exc.message}", errors=errors)


def on_unsupported_document(
    request: Request[Any, Any, Any], exc: UnsupportedDocumentError
) -> Response[Any]:
    return _input_problem(request, 415, exc)


def on_too_large(request: Request[Any, Any, Any], exc: TooLargeError) -> Response[Any]:
    return _input_problem(request, 413, exc)


def on_index_unavailable(
    request: Request[Any, Any, Any], exc: IndexUnavailableError
) -> Response[Any]:
    log.error("vector_store_unavailable", error=str(exc))
    return problem(
        request,
        503,
        f"the vector store is unavailable ({exc}); nothing is lost, retry later",
        headers={"Retry-After": "5"},
    )


def on_not_found(request: Request[Any, Any, Any], exc: NotFoundError) -> Response[Any]:
    return problem(request, 404, str(exc))


def on_conflict(request: Request[Any, Any, Any], exc: ConflictError) -> Response[Any]:
    return problem(request, 409, f"conflicts with stored data: {exc}")


def on_engine(request: Request[Any, Any, Any], exc: EngineError) -> Response[Any]:
    log.warning("engine_failed", error=str(exc), path=request.url.path)
    return problem(
        request,
        503,
        f"the LLM engine failed: {exc}. Your message was stored; retry later.",
        headers={"Retry-After": "5"},
    )


# What a 503 that did nothing adds: a client may send the same request again, even one
# that stores (a chat turn), where after other 503s it might store a message twice.
_NOTHING_DONE = {"x-should-retry": "true"}


def on_engine_busy(request: Request[Any, Any, Any], exc: EngineBusyError) -> Response[Any]:
    return problem(
        request,
        503,
        f"the LLM engine is busy ({exc}); nothing was stored, retry later",
        headers={"Retry-After": "2", **_NOTHING_DONE},
    )


def on_session_busy(request: Request[Any, Any, Any], exc: SessionBusyError) -> Response[Any]:
    log.warning("session_lock_timeout", session_id=exc.session_id, timeout_s=exc.timeout_s)
    return problem(
        request,
        503,
        f"{exc}; nothing was stored, retry later",
        headers={"Retry-After": "2", **_NOTHING_DONE},
    )


def on_rate_limiter_unavailable(
    request: Request[Any, Any, Any], exc: RateLimiterUnavailableError
) -> Response[Any]:
    # Logged where Redis failed (app/access/rate_limits.py); the answer names no internals.
    return problem(
        request,
        503,
        "the rate limiter (Redis) is unavailable; nothing was done, retry later",
        headers={"Retry-After": "5", **_NOTHING_DONE},
    )


def on_invalid_data(request: Request[Any, Any, Any], exc: InvalidDataError) -> Response[Any]:
    return problem(request, 422, f"the database refused a value: {exc}")


def on_database(request: Request[Any, Any, Any], exc: DatabaseUnavailableError) -> Response[Any]:
    log.error("database_unavailable", error=str(exc))
    return problem(request, 503, "the database is unavailable", headers={"Retry-After": "5"})


def on_model_mismatch(
    request: Request[Any, Any, Any], exc: EmbeddingModelMismatchError
) -> Response[Any]:
    return problem(request, 500, str(exc))


def on_http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    if isinstance(exc, ValidationException):
        return on_validation(request, exc)
    if exc.status_code == 401 and _is_admin_page(request.url.path):
        # A browser on the admin page without a key goes to the sign-in form.
        return Redirect("/admin/login", status_code=303)
    detail = exc.detail if exc.detail != HTTPStatus(exc.status_code).phrase else ""
    return problem(
        request,
        exc.status_code,
        detail or HTTPStatus(exc.status_code).description,
        headers=dict(exc.headers or {}),  # e.g. Allow on 405
    )


def _is_admin_page(path: str) -> bool:
    return (path == "/admin" or path.startswith("/admin/")) and not path.startswith("/admin/v1")


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    # Process boundary: log the full error, answer without internals.
    log.exception("unhandled_error", path=request.url.path)
    return problem(request, 500, "internal error; the request was not completed")


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ValidationException: on_validation,
    BadBodyError: on_bad_body,
    UnsupportedDocumentError: on_unsupported_document,
    TooLargeError: on_too_large,
    InvalidInputError: on_invalid_input,
    IndexUnavailableError: on_index_unavailable,
    NotFoundError: on_not_found,
    ConflictError: on_conflict,
    EngineBusyError: on_engine_busy,
    EngineError: on_engine,
    SessionBusyError: on_session_busy,
    RateLimiterUnavailableError: on_rate_limiter_unavailable,
    InvalidDataError: on_invalid_data,
    DatabaseUnavailableError: on_database,
    EmbeddingModelMismatchError: on_model_mismatch,
    HTTPException: on_http,
    Exception: on_unexpected,
}


# The OpenAI-compatible routes answer the same errors in OpenAI's shape ----------------

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}
_OPENAI_CODES = {
    401: "invalid_api_key",
    404: "not_found",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def openai_error_body(status: int, message: str, param: str | None) -> dict[str, Any]:
    """`{"error": {message, type, param, code}}`, as OpenAI's SDKs read it."""
    kind = _OPENAI_TYPES.get(status) or (
        "server_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "error": {
            "message": message,
            "type": kind,
            "param": param,
            "code": _OPENAI_CODES.get(status),
        }
    }


def _openai_shaped(handler: Any) -> Any:
    """The problem answer of `handler`, re-shaped: invalid requests are 400 (OpenAI has no
    422), the offending field is `param`, and `x-should-retry: false` tells the SDKs not
    to retry on their own what may have stored the message already (only a busy engine or
    session, a rate limit or an unavailable rate limiter, where nothing was stored, may be
    retried)."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        answer = handler(request, exc)
        problem_content = answer.content if isinstance(answer.content, dict) else {}
        status = 400 if answer.status_code == 422 else answer.status_code
        errors = problem_content.get("errors") or []
        param = errors[0].get("field") if errors else None
        message = str(problem_content.get("detail") or HTTPStatus(status).phrase)
        headers = dict(answer.headers)
        headers.pop("content-type", None)
        retry = status == 429 or isinstance(
            exc, EngineBusyError | SessionBusyError | RateLimiterUnavailableError
        )
        headers["x-should-retry"] = "true" if retry else "false"
        return Response(
            openai_error_body(status, message, param),
            status_code=status,
            media_type="application/json",
            headers=headers,
        )

    return handle


OPENAI_EXCEPTION_HANDLERS: dict[Any, Any] = {
    exc_type: _openai_shaped(handler) for exc_type, handler in EXCEPTION_HANDLERS.items()
}
