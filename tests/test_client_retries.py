"""When the client sends a request again: scripted answers (`httpx.MockTransport`) and
the number of requests each gets, blocking and async. The API's word decides: a 429, or
a 503 with `Retry-After` that did nothing (`x-should-retry: true`) or answered an
idempotent request; never another error."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable

import httpx
import pytest

from memchat import AsyncMemchatClient, MemchatClient, RetryPolicy
from memchat.errors import (
    ApiError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    ServerUnreachableError,
    ServiceUnavailableError,
    UnexpectedAnswerError,
)

SESSION = {
    "id": "s1",
    "user_id": "alice",
    "title": None,
    "metadata": {},
    "created_at": "2026-01-05T10:00:00Z",
    "num_messages": 0,
}


def problem(status: int, detail: str, **headers: str) -> httpx.Response:
    body = {
        "type": "about:blank",
        "title": "t",
        "status": status,
        "detail": detail,
        "instance": "/",
    }
    return httpx.Response(
        status, json=body, headers={"content-type": "application/problem+json", **headers}
    )


def ok() -> httpx.Response:
    return httpx.Response(200, json=SESSION)


class Script:
    """Answers requests in order and records them."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        # A fresh answer each time: an answer's body is read once.
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


async def _async_call(script: Script, policy: RetryPolicy, method: str) -> object:
    transport = httpx.MockTransport(script)
    async with AsyncMemchatClient("http://memchat", retry=policy, transport=transport) as client:
        if method == "GET":
            return await client.get_session("s1")
        return await client.create_session("alice")


def _sync_call(script: Script, policy: RetryPolicy, method: str) -> object:
    transport = httpx.MockTransport(script)
    with MemchatClient("http://memchat", retry=policy, transport=transport) as client:
        if method == "GET":
            return client.get_session("s1")
        return client.create_session("alice")


Call = Callable[[Script, RetryPolicy, str], object]


@pytest.fixture(params=["sync", "async"])
def call(request: pytest.FixtureRequest) -> Call:
    if request.param == "sync":
        return _sync_call

    def run(script: Script, policy: RetryPolicy, method: str) -> object:
        return asyncio.run(_async_call(script, policy, method))

    return run


RETRIED = [
    ("POST", problem(429, "rate limit", **{"Retry-After": "0"})),
    ("POST", problem(503, "busy", **{"Retry-After": "0", "x-should-retry": "true"})),
    ("GET", problem(503, "database down", **{"Retry-After": "0"})),
]


@pytest.mark.parametrize(("method", "refusal"), RETRIED)
def test_what_the_api_allows_is_sent_again_and_succeeds(
    call: Call, method: str, refusal: httpx.Response
) -> None:
    script = Script(refusal, refusal, ok())
    session = call(script, RetryPolicy(max_retries=2), method)
    assert getattr(session, "id", None) == "s1"
    assert [r.method for r in script.requests] == [method] * 3


@pytest.mark.parametrize(("method", "refusal"), RETRIED)
def test_retries_stop_at_max_retries(call: Call, method: str, refusal: httpx.Response) -> None:
    script = Script(refusal, refusal, refusal, ok())
    with pytest.raises(ApiError) as raised:
        call(script, RetryPolicy(max_retries=2), method)
    assert len(script.requests) == 3
    assert raised.value.status == refusal.status_code


NOT_RETRIED = [
    ("POST", problem(503, "engine failed, stored", **{"Retry-After": "0"}),
     ServiceUnavailableError),
    ("POST", problem(503, "no retry", **{"Retry-After": "0", "x-should-retry": "false"}),
     ServiceUnavailableError),
    ("GET", problem(503, "no Retry-After"), ServiceUnavailableError),
    ("GET", problem(429, "no Retry-After"), RateLimitedError),
    ("GET", problem(404, "session 's1' not found"), NotFoundError),
    ("POST", problem(422, "invalid request", **{"Retry-After": "0"}), InvalidRequestError),
    ("GET", problem(500, "internal error", **{"Retry-After": "0"}), ServerError),
    ("GET", problem(429, "come back in a minute", **{"Retry-After": "60"}), RateLimitedError),
]  # fmt: skip


@pytest.mark.parametrize(("method", "refusal", "error"), NOT_RETRIED)
def test_other_answers_are_raised_at_once(
    call: Call, method: str, refusal: httpx.Response, error: type[ApiError]
) -> None:
    script = Script(refusal, ok())
    with pytest.raises(error) as raised:
        call(script, RetryPolicy(max_retries=2, max_wait_s=30), method)
    assert len(script.requests) == 1
    assert raised.value.detail == refusal.json()["detail"]
    assert raised.value.status == refusal.status_code


def test_retry_after_as_an_http_date_is_waited_for(call: Call) -> None:
    when = email.utils.formatdate(time.time() + 1, usegmt=True)
    script = Script(problem(429, "later", **{"Retry-After": when}), ok())
    call(script, RetryPolicy(max_retries=1, max_wait_s=5), "GET")
    assert len(script.requests) == 2


def test_a_policy_of_no_retries_sends_once(call: Call) -> None:
    script = Script(problem(429, "rate limit", **{"Retry-After": "0"}), ok())
    with pytest.raises(RateLimitedError):
        call(script, RetryPolicy(max_retries=0), "GET")
    assert len(script.requests) == 1


def test_an_answer_that_is_not_problem_details_keeps_its_status(call: Call) -> None:
    script = Script(httpx.Response(502, text="<html>Bad Gateway</html>"))
    with pytest.raises(ServerError) as raised:
        call(script, RetryPolicy(), "GET")
    assert (raised.value.status, raised.value.detail) == (502, "<html>Bad Gateway</html>")


def test_a_server_that_cannot_be_reached_is_one_error(call: Call) -> None:
    script = Script(httpx.ConnectError("connection refused"))
    with pytest.raises(ServerUnreachableError, match="ConnectError: connection refused"):
        call(script, RetryPolicy(), "GET")
    assert len(script.requests) == 1


def test_a_successful_answer_that_is_not_the_documented_body_is_one_error(call: Call) -> None:
    script = Script(httpx.Response(200, json={"id": "s1"}))
    with pytest.raises(UnexpectedAnswerError, match="GET /v1/sessions/s1: Object missing"):
        call(script, RetryPolicy(), "GET")
