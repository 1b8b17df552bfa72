"""Per-key rate limits shared by every API process: a token bucket per key in Redis.

Behind a load balancer each process's own bucket (`RateLimiter`) lets a
key make N times its limit across N processes. Here every process runs the same Lua
script against one Redis server, so the bucket of a key is one bucket:

- The check is one script call, atomic in Redis: read the bucket, refill it for the time
  since its last request, take a token or compute the wait. No two processes can both
  take the last token.
- Time is Redis's own (`TIME`), so processes whose clocks disagree still share one
  bucket; tests may pass a clock instead.
- A bucket's key expires once it would be full again: an idle key leaves nothing behind,
  and a missing key is a full bucket, so expiry never changes an answer.
- Redis down (refused, timed out, any Redis error) raises `RateLimiterUnavailableError`:
  the request is refused (503), never let through unlimited.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)


class RateLimits(Protocol):
    """Counts a key's requests against its limit: `per_minute` a minute, bursts up to that
    many (a token bucket holding `per_minute` tokens, refilled at `per_minute / 60` a second)."""

    async def retry_after_s(self, key_id: int | str, per_minute: int, *, take: bool = True) -> int:
        """0 if the request may proceed (and is counted, unless not `take`: then it only
        looks), else whole seconds until it may. `key_id`: a key's id, or the name of
        another bucket (`auth-failures:<address>`)."""
        ...


class RateLimiter:
    """A token bucket per key (or other bucket name): `per_minute` requests a minute,
    bursts up to that many.

    In-process: with several API processes each enforces its own share of the limit
    (`RedisRateLimits` shares one bucket between them). Buckets
    that would be full again are dropped once there are many (one per client address
    of failed sign-ins can grow without bound otherwise).
    """

    MAX_BUCKETS = 100_000

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[int | str, tuple[float, float, int]] = {}

    async def retry_after_s(self, key_id: int | str, per_minute: int, *, take: bool = True) -> int:
        """0 if the request may proceed (and is counted, unless not `take`), else seconds
        until it may."""
        now = self._clock()
        stored = self._buckets.get(key_id)
        tokens, last, _ = stored if stored else (float(per_minute), now, per_minute)
        rate = per_minute / 60.0
        tokens = min(float(per_minute), tokens + (now - last) * rate)
        if tokens >= 1.0:
            if take:
                self._store(key_id, (tokens - 1.0, now, per_minute))
            return 0
        self._store(key_id, (tokens, now, per_minute))
        return max(1, math.ceil((1.0 - tokens) / rate))

    def _store(self, key_id: int | str, state: tuple[float, float, int]) -> None:
        if key_id not in self._buckets and len(self._buckets) >= self.MAX_BUCKETS:
            now = self._clock()
            self._buckets = {
                k: (tokens, last, size)
                for k, (tokens, last, size) in self._buckets.items()
                if tokens + (now - last) * size / 60.0 < size
            }
        self._buckets[key_id] = state


class RateLimiterUnavailableError(RuntimeError):
    """The shared rate limiter could not answer: requests must wait, not go unlimited."""


# KEYS[1]: the key's bucket (a hash: tokens, ms of its last request).
# ARGV[1]: requests per minute (the bucket's size); ARGV[2]: now in ms, "" = Redis TIME;
# ARGV[3]: "0" only looks (takes no token and writes nothing).
# Returns 0 (a token was (or could be) taken) or the whole seconds until one is there.
# Times are integer milliseconds (exact in Lua's doubles); numbers are written with
# string.format, since Lua's default "%.14g" would round them.
TOKEN_BUCKET_LUA = """
local capacity = tonumber(ARGV[1])
local now
if ARGV[2] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local rate = capacity / 60000.0
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ms')
local tokens = tonumber(state[1]) or capacity
local last = tonumber(state[2]) or now
if now > last then
  tokens = tokens + (now - last) * rate
else
  now = last
end
if tokens > capacity then
  tokens = capacity
end
local wait_s = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait_s = math.max(1, math.ceil((1 - tokens) / rate / 1000))
end
if ARGV[3] == '0' then
  return wait_s
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
  'ms', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((capacity - tokens) / rate) + 1000))
return wait_s
"""


class RedisRateLimits:
    """`RateLimits` in Redis, shared by every process that uses the same server and prefix.

    `clock` (seconds) replaces Redis `TIME` for tests; every process sharing a bucket
    must then share the clock.
    """

    def __init__(
        self, client: Redis, prefix: str, *, clock: Callable[[], float] | None = None
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._script = client.register_script(TOKEN_BUCKET_LUA)

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str,
        *,
        timeout_s: float,
        clock: Callable[[], float] | None = None,
    ) -> RedisRateLimits:
        """A client that connects on first use (no I/O here). One retry, at once, covers a
        pooled connection that a Redis restart closed; past that the request is refused."""
        client = Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), retries=1),
        )
        return cls(client, prefix, clock=clock)

    def bucket_key(self, key_id: int | str) -> str:
        return f"{self._prefix}:rate:{key_id}"

    async def retry_after_s(self, key_id: int | str, per_minute: int, *, take: bool = True) -> int:
        now_ms = "" if self._clock is None else str(math.floor(self._clock() * 1000))
        args: list[int | str] = [per_minute, now_ms, "1" if take else "0"]
        try:
            wait_s = await self._script(keys=[self.bucket_key(key_id)], args=args)
        except RedisError as exc:
            log.error("rate_limiter_unavailable", error=str(exc))
            raise RateLimiterUnavailableError(f"Redis did not answer: {exc}") from exc
        return int(wait_s)

    async def ping(self) -> None:
        """Redis answers (for /readyz)."""
        try:
            await self._client.ping()
        except RedisError as exc:
            raise RateLimiterUnavailableError(f"Redis did not answer: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()
