"""memchat's errors as MCP tool errors: the message an agent reads, never a traceback.

The texts are those of the REST API's problem details (app/api/errors.py). The SDK
answers a `ToolError` with `is_error: true` and `Error executing tool <name>: <message>`;
anything not mapped here is a crash, which the SDK logs and answers without detail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from litestar.exceptions import HTTPException
from mcp.server.mcpserver.exceptions import ToolError

from retrieval.errors import (
    EngineBusyError,
    EngineError,
    IndexUnavailableError,
    InvalidInputError,
)
from storage.errors import (
    ConflictError,
    DatabaseUnavailableError,
    InvalidDataError,
    NotFoundError,
)


def _invalid_input(exc: InvalidInputError) -> str:
    return f"{exc.field}: {exc.message}"


def _refused(exc: HTTPException) -> str:
    """An API key refused by the access gate (stdio: unknown, revoked or rate-limited)."""
    return exc.detail


def _index(exc: IndexUnavailableError) -> str:
    return f"the vector store is unavailable ({exc}); nothing is lost, retry later"


def _engine_busy(exc: EngineBusyError) -> str:
    return f"the LLM engine is busy ({exc}); nothing was stored, retry later"


def _engine(exc: EngineError) -> str:
    return f"the LLM engine failed: {exc}; retry later"


# Most specific first: the first class that matches names the message.
MESSAGES: tuple[tuple[type[Exception], Callable[..., str]], ...] = (
    (InvalidInputError, _invalid_input),
    (NotFoundError, str),
    (ConflictError, lambda exc: f"conflicts with stored data: {exc}"),
    (InvalidDataError, lambda exc: f"the database refused a value: {exc}"),
    (DatabaseUnavailableError, lambda _exc: "the database is unavailable; retry later"),
    (IndexUnavailableError, _index),
    (EngineBusyError, _engine_busy),
    (EngineError, _engine),
    (HTTPException, _refused),
)
MAPPED = tuple(kind for kind, _ in MESSAGES)


def message_of(exc: Exception) -> str:
    return next(text(exc) for kind, text in MESSAGES if isinstance(exc, kind))


@contextmanager
def tool_errors() -> Iterator[None]:
    """Raise memchat's expected failures as `ToolError`s carrying their message."""
    try:
        yield
    except MAPPED as exc:
        raise ToolError(message_of(exc)) from exc
