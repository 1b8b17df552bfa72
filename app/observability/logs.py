"""Where log lines go: a stream whose failures never reach the code that logs.

A request logs as it is answered (its `http_request` line, an error handler's line). If
writing the log fails (a full disk, ENOSPC; a closed pipe, EPIPE), the failure must not
become the request's: a request that would have succeeded still succeeds, one whose own
storage fails is still the 503 problem document. So a line that cannot be written is
dropped and counted (`memchat_log_write_failures_total` on /metrics, read by
`LogFailuresCollector`); nothing is retried or buffered, and nothing is logged about it
(the log is what failed). The count is the process's: the log is configured once per
process (`app.cli.logs.configure_logging`), not per app.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import IO

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class WriteFailures:
    """How many log lines could not be written, in this process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self) -> None:
        with self._lock:
            self._count += 1

    @property
    def count(self) -> int:
        return self._count


FAILURES = WriteFailures()


class LogStream:
    """A text stream over `stream` whose writes and flushes never raise OSError.

    Both writers of the log write a line and then flush (structlog's `print(...,
    flush=True)`, a logging handler's `emit`): a line with any failed write or a failed
    flush counts once, at its flush. Each writer gets its own LogStream, since each
    holds its own lock around its line."""

    def __init__(self, stream: IO[str], failures: WriteFailures = FAILURES) -> None:
        self._stream = stream
        self._failures = failures
        self._has_failed = False

    def write(self, text: str) -> int:
        try:
            self._stream.write(text)
        except OSError:
            self._has_failed = True
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._has_failed = True
        if self._has_failed:
            self._has_failed = False
            self._failures.add()


class LogFailuresCollector(Collector):
    """`memchat_log_write_failures_total`, read from the process's count at each scrape."""

    def __init__(self, failures: WriteFailures = FAILURES) -> None:
        self._failures = failures

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "memchat_log_write_failures",
            "Log lines this process could not write (a full disk: they were dropped; the "
            "requests that logged them were answered as usual).",
            value=self._failures.count,
        )
