"""Rate limits shared by every API process, in the real Redis server (MEMCHAT_TEST_REDIS_URL,
default 127.0.0.1:6379): two limiters (two processes) draw on one bucket per key, buckets
refill at the key's rate, and a Redis that cannot be reached refuses requests with 503,
never lets them through.

Every test keys its buckets under a prefix of its own, deleted at the end, so parallel
runs on one server never meet.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from litestar import Litestar
from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.access.rate_limits import RateLimiter, RedisRateLimits
from app.factory import create_app
from app.settings import AccessSettings, Settings
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine

REDIS_URL = os.environ.get("MEMCHAT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
UNAVAILABLE = "the rate limiter (Redis) is unavailable; nothing was done, retry later"


@pytest.fixture(scope="session")
async def redis_url() -> str:
    client = Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        await client.ping()
    except RedisError as exc:
        pytest.skip(f"NO REDIS SERVER at {REDIS_URL} ({exc}): the shared rate limits are untested")
    finally:
        await client.aclose()
    return REDIS_URL


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    name = f"memchat-test-{uuid.uuid4().hex[:12]}"
    yield name
    client = Redis.from_url(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{name}:*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


class Clock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Processes:
    """Two limiters with clients of their own, as two API processes have, on one clock."""

    a: RedisRateLimits
    b: RedisRateLimits
    clock: Clock


@pytest.fixture
async def processes(redis_url: str, prefix: str) -> AsyncIterator[Processes]:
    clock = Clock()
    a, b = (RedisRateLimits.from_url(redis_url, prefix, timeout_s=2, clock=clock) for _ in range(2))
    try:
        yield Processes(a, b, clock)
    finally:
        await a.aclose()
        await b.aclose()


async def test_two_processes_share_one_bucket_per_key(
    processes: Processes,
) -> None:
    a, b = processes.a, processes.b
    answers = [await (a if n % 2 == 0 else b).retry_after_s(7, 5) for n in range(5)]
    assert answers == [0, 0, 0, 0, 0]
    # 5 a minute: a token every 12 s, whichever process asks.
    assert await b.retry_after_s(7, 5) == 12
    assert await a.retry_after_s(7, 5) == 12
    # Another key has its own bucket.
    assert await b.retry_after_s(8, 5) == 0


async def test_concurrent_requests_take_exactly_the_limit(
    processes: Processes,
) -> None:
    a, b = processes.a, processes.b
    answers = await asyncio.gather(*(limits.retry_after_s(3, 10) for limits in [a, b] * 10))
    assert sorted(answers) == [0] * 10 + [6] * 10


async def test_buckets_refill_at_the_rate_and_match_the_in_process_limiter(
    processes: Processes,
) -> None:
    a, b = processes.a, processes.b
    clock = processes.clock
    local = RateLimiter(clock=clock)
    # (seconds since the step before, requests now)
    script = [(0.0, 60), (0.5, 1), (0.5, 2), (59.0, 61), (30.0, 31), (2.0, 3)]
    shared: list[list[int]] = []
    in_process: list[list[int]] = []
    for step_s, num_requests in script:
        clock.now += step_s
        shared.append([await (a, b)[n % 2].retry_after_s(1, 60) for n in range(num_requests)])
        in_process.append([await local.retry_after_s(1, 60) for _ in range(num_requests)])
    assert shared == in_process
    assert shared == [
        [0] * 60,  # a full bucket: the whole minute's requests at once
        [1],  # half a token after 0.5 s: wait for the other half
        [0, 1],  # a whole token after 1 s
        [0] * 59 + [1, 1],  # 59 s refill 59 tokens
        [0] * 30 + [1],
        [0, 0, 1],
    ]


async def test_retry_after_counts_whole_seconds_up(
    processes: Processes,
) -> None:
    a, b = processes.a, processes.b
    clock = processes.clock
    assert [await a.retry_after_s(2, 2), await b.retry_after_s(2, 2)] == [0, 0]
    assert await a.retry_after_s(2, 2) == 30
    clock.now += 10.5
    assert await b.retry_after_s(2, 2) == 20  # 19.5 s to go
    clock.now += 20.0
    assert await a.retry_after_s(2, 2) == 0


async def test_a_bucket_expires_once_it_would_be_full(processes: Processes, redis_url: str) -> None:
    a = processes.a
    client = Redis.from_url(redis_url)
    try:
        assert await a.retry_after_s(5, 60) == 0
        # One token short: full again in 1 s, kept 1 s longer.
        assert 0 < await client.pttl(a.bucket_key(5)) <= 2_000
        for _ in range(60):
            await a.retry_after_s(5, 60)
        assert 58_000 < await client.pttl(a.bucket_key(5)) <= 61_000
        assert await client.pttl(a.bucket_key(6)) == -2  # never asked: no key
    finally:
        await client.aclose()


async def test_without_a_clock_the_bucket_runs_on_redis_time(redis_url: str, prefix: str) -> None:
    limits = RedisRateLimits.from_url(redis_url, prefix, timeout_s=2)
    try:
        answers = [await limits.retry_after_s(1, 60) for _ in range(200)]
        refused = answers.index(1)
        assert refused >= 60
        assert set(answers[:refused]) == {0}
        await asyncio.sleep(1.05)  # over a whole token, at 60 a minute
        assert await limits.retry_after_s(1, 60) == 0
    finally:
        await limits.aclose()


# Through the app ------------------------------------------------------------------------


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def make_keys(database_url: str) -> tuple[str, str]:
    """A key limited to 2 requests a minute and one without a limit."""
    engine = create_engine(database_url)
    try:
        access = AccessRepository(Database(engine))
        _, limited = await access.create_key("acme", "slow", requests_per_minute=2)
        _, unlimited = await access.create_key("acme", "batch", requests_per_minute=0)
    finally:
        await engine.dispose()
    return limited, unlimited


def settings_for(data_dir: Path, database_url: str, redis_url: str, prefix: str) -> Settings:
    access = AccessSettings(redis_url=redis_url, redis_prefix=prefix, redis_timeout_s=2)
    return Settings(data_dir=data_dir, database_url=database_url, access=access)


def make_app(settings: Settings) -> Litestar:
    return create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."]))


async def test_two_apps_on_one_redis_share_a_keys_limit(
    tmp_path: Path, sqlite_url: str, redis_url: str, prefix: str
) -> None:
    limited, _ = await make_keys(sqlite_url)
    first = make_app(settings_for(tmp_path / "a", sqlite_url, redis_url, prefix))
    second = make_app(settings_for(tmp_path / "b", sqlite_url, redis_url, prefix))
    async with local_client(first) as one, local_client(second) as two:
        began = time.monotonic()
        assert (await one.get("/v1/knowledge", headers=bearer(limited))).status_code == 200
        assert (await two.get("/v1/knowledge", headers=bearer(limited))).status_code == 200
        for client in (one, two):
            third = await client.get("/v1/knowledge", headers=bearer(limited))
            assert third.status_code == 429, third.text
            wait_s = third.headers["retry-after"]
            assert wait_s in waits_since(began, per_minute=2)
            assert third.json()["detail"] == (
                f"rate limit of 2 requests per minute for this key reached; retry in {wait_s} s"
            )
        ready = (await one.get("/readyz")).json()
        assert ready["checks"]["rate_limiter"] == "ok (redis)"


async def test_two_apps_on_one_redis_share_an_addresss_failed_attempts(
    tmp_path: Path, sqlite_url: str, redis_url: str, prefix: str
) -> None:
    _, unlimited = await make_keys(sqlite_url)
    apps = []
    for name in ("a", "b"):
        settings = settings_for(tmp_path / name, sqlite_url, redis_url, prefix)
        access = settings.access.model_copy(update={"failed_auth_per_minute": 2})
        apps.append(make_app(settings.model_copy(update={"access": access})))
    async with local_client(apps[0]) as one, local_client(apps[1]) as two:
        began = time.monotonic()
        for client in (one, two):
            wrong = await client.get("/v1/knowledge", headers=bearer("mck_wrong"))
            assert wrong.status_code == 401, wrong.text
        for client in (one, two):
            third = await client.get("/v1/knowledge", headers=bearer(unlimited))
            assert third.status_code == 429, third.text
            wait_s = third.headers["retry-after"]
            assert wait_s in waits_since(began, per_minute=2)
            assert third.json()["detail"] == (
                "too many unknown API keys or failed sign-ins from this address "
                f"(2 a minute); retry in {wait_s} s"
            )


def waits_since(began: float, *, per_minute: int) -> set[str]:
    """The Retry-After a bucket of `per_minute` answers now when its first token was
    taken after `began` and the rest at once: a token's refill time (60 / per_minute s)
    less the whole seconds refilled since, on Redis's clock. "30" alone for 2 a minute
    asked within a second; one more value per second a slow machine took."""
    elapsed = time.monotonic() - began
    interval = 60 // per_minute
    return {str(max(1, interval - s)) for s in range(math.floor(elapsed) + 1)}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound but never listening: connecting to it is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_an_unreachable_redis_refuses_requests_with_503(
    tmp_path: Path, sqlite_url: str, closed_port: int
) -> None:
    limited, unlimited = await make_keys(sqlite_url)
    down = f"redis://127.0.0.1:{closed_port}/0"
    app = make_app(settings_for(tmp_path / "data", sqlite_url, down, "memchat-down"))
    async with local_client(app) as client:
        for _ in range(3):  # never let through, however often asked
            answer = await client.get("/v1/knowledge", headers=bearer(limited))
            assert answer.status_code == 503, answer.text
            assert answer.headers["content-type"].startswith("application/problem+json")
            assert answer.headers["retry-after"] == "5"
            assert answer.json() == {
                "type": "about:blank",
                "title": "Service Unavailable",
                "status": 503,
                "detail": UNAVAILABLE,
                "instance": "/v1/knowledge",
            }
        openai = await client.post(
            "/v1/chat/completions",
            headers=bearer(limited),
            json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert openai.status_code == 503, openai.text
        assert openai.headers["x-should-retry"] == "true"
        assert openai.json() == {
            "error": {
                "message": UNAVAILABLE,
                "type": "server_error",
                "param": None,
                "code": "service_unavailable",
            }
        }
        # A key without a limit is served: while Redis is down, failed attempts are
        # counted by each process.
        assert (await client.get("/v1/knowledge", headers=bearer(unlimited))).status_code == 200
        for _ in range(10):
            assert (await client.get("/v1/knowledge", headers=bearer("mck_x"))).status_code == 401
        throttled = await client.get("/v1/knowledge", headers=bearer(unlimited))
        assert throttled.status_code == 429, throttled.text
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "not ready"
        assert ready.json()["checks"]["rate_limiter"].startswith("error: Redis did not answer: ")
