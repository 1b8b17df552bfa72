"""Per-key rate limits shared by every API process: a token bucket per key in Redis.

Behind a load balancer each process's own bucket (`app.access.keys.RateLimiter`) lets a
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
from collections.abc import Callable
from typing import Protocol

import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)


class RateLimits(Protocol):
    """Counts a key's requests against its limit: `per_minute` a minute, bursts up to that
    many (a token bucket holding `per_minute` tokens, refilled at `per_minute / 60` a second)."""

    async def retry_after_s(self, key_id: int, per_minute: int) -> int:
        """0 if the request may proceed (and is counted), else whole seconds until it may."""
        ...


class RateLimiterUnavailableError(RuntimeError):
    """The shared rate limiter could not answer: requests must wait, not go unlimited."""


# KEYS[1]: the key's bucket (a hash: tokens, ms of its last request).
# ARGV[1]: requests per minute (the bucket's size); ARGV[2]: now in ms, "" = Redis TIME.
# Returns 0 (a token was taken) or the whole seconds until one is there (at least 1).
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

    def bucket_key(self, key_id: int) -> str:
        return f"{self._prefix}:rate:{key_id}"

    async def retry_after_s(self, key_id: int, per_minute: int) -> int:
        now_ms = "" if self._clock is None else str(math.floor(self._clock() * 1000))
        try:
            wait_s = await self._script(keys=[self.bucket_key(key_id)], args=[per_minute, now_ms])
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
