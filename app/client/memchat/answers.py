"""Reading the server's answers: error answers become typed exceptions, and whether and
when a refused request may be sent again.

The API says when to retry: a 429 (the rate limiter refused before anything was done)
and a 503 with `Retry-After`. A 503 can also follow a stored message (the engine failed
after the turn's message was stored), so a request that is not idempotent is sent again
only where the server adds `x-should-retry: true` (a busy engine or session, an
unavailable rate limiter: nothing was stored).
"""

from __future__ import annotations

import datetime as dt
import email.utils
from dataclasses import dataclass

import httpx
import msgspec

from memchat.errors import ApiError, error_for
from memchat.types import ProblemDetails

_problem = msgspec.json.Decoder(ProblemDetails)
_MAX_DETAIL_CHARS = 500


def retry_after_s(response: httpx.Response) -> float | None:
    """The answer's `Retry-After` in seconds (it may be a number or an HTTP date)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def error_of(response: httpx.Response, content: bytes) -> ApiError:
    """The typed exception for an error answer; an answer that is not problem details
    (a proxy's page) keeps its status, with the start of its text as the detail."""
    try:
        problem = _problem.decode(content)
    except msgspec.DecodeError:
        problem = ProblemDetails(
            type="about:blank",
            title=response.reason_phrase,
            status=response.status_code,
            detail=content.decode("utf-8", "replace")[:_MAX_DETAIL_CHARS],
            instance=response.request.url.path,
        )
    return error_for(problem, retry_after_s(response))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Up to `max_retries` more tries of a request the API says may be retried, each
    after the server's `Retry-After`; a wait longer than `max_wait_s` is not waited for
    (the error is raised at once)."""

    max_retries: int = 2
    max_wait_s: float = 30.0

    def wait_s(
        self, response: httpx.Response, *, is_idempotent: bool, num_retries: int
    ) -> float | None:
        """Seconds to wait before sending the request again, or None: do not."""
        if num_retries >= self.max_retries or response.status_code not in (429, 503):
            return None
        wait = retry_after_s(response)
        if wait is None or wait > self.max_wait_s:
            return None
        said_nothing_done = response.headers.get("x-should-retry", "").lower() == "true"
        if response.status_code == 503 and not (is_idempotent or said_nothing_done):
            return None
        return wait
