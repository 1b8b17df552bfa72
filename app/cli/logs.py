"""The process's log, configured once by the command that runs (`app.cli.main`) or by a
worker process that builds its own app (`app.cli.workers`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import IO, Any, TextIO, cast

import structlog

from app.observability.logs import LogStream


def configure_logging(
    level: str, *, extra_processors: Sequence[Any] = (), stream: IO[str] | None = None
) -> None:
    """The process's log: structlog's lines and the standard library's, on `stream`
    (standard error by default). A line that cannot be written (a full disk) is dropped
    and counted, never raised into the code that logged (`app.observability.logs`)."""
    target = sys.stderr if stream is None else stream
    logging.basicConfig(level=level.upper(), format="%(message)s", stream=LogStream(target))
    # Alembic names each of its plugins at start-up: seven lines of noise before every
    # command's own output (and before a start-up error's one line).
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            # The request id (and anything else bound for the request) on every line.
            structlog.contextvars.merge_contextvars,
            *extra_processors,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # structlog's type is TextIO; it calls write and flush only.
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, LogStream(target))),
    )


def severest(*levels: str) -> str:
    """The most severe of some standard level names, in any case ("info", "WARNING")."""
    return max(levels, key=lambda level: logging.getLevelNamesMapping()[level.upper()])
