"""Choosing an engine replica: rendezvous hashing of the user, circuit breakers, backoff.

A user's turns go to one replica so that their conversation's prefix stays in that
replica's KV cache. Rendezvous (highest random weight) hashing orders the replicas per
user: every user's first choice is stable, and when a replica leaves (or its breaker
opens) only the users whose first choice it was move, each to their own second choice.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class CircuitBreaker:
    """Stops sending to a replica after consecutive failures, then probes it again.

    Closed: requests pass. After `failure_threshold` consecutive failures it opens for
    `reset_after_s`: requests skip the replica. Then one request at a time may probe it
    (half open); a success closes the breaker, a failure opens it again.
    """

    def __init__(
        self,
        failure_threshold: int = 3,
        reset_after_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = max(1, failure_threshold)
        self._reset_after_s = reset_after_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at < self._reset_after_s:
            return "open"
        return "half-open"

    def allow(self) -> bool:
        """Whether a request may go to the replica now (claims the probe when half open)."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self._probing:
            return False
        self._probing = True
        return True

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def release(self) -> None:
        """A claimed probe ended without a verdict (the caller went away)."""
        self._probing = False

    def record_failure(self) -> None:
        self._failures += 1
        self._probing = False
        if self._opened_at is not None or self._failures >= self._threshold:
            self._opened_at = self._clock()


@dataclass(slots=True)
class Replica:
    url: str
    breaker: CircuitBreaker


def _weight(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{url}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class ReplicaSet:
    def __init__(
        self,
        urls: Sequence[str],
        *,
        failure_threshold: int = 3,
        reset_after_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("at least one engine URL is needed")
        self.replicas = [
            Replica(url.rstrip("/"), CircuitBreaker(failure_threshold, reset_after_s, clock))
            for url in urls
        ]

    def ranked(self, key: str) -> list[Replica]:
        """Every replica, the user's preferred one first (rendezvous hashing)."""
        return sorted(self.replicas, key=lambda r: _weight(key, r.url), reverse=True)

    def candidates(self, key: str) -> list[Replica]:
        """The replicas to try for `key`, in order, less those whose breaker is open.

        Callers still ask `breaker.allow()` right before sending, which claims the single
        probe of a half-open breaker.
        """
        return [r for r in self.ranked(key) if r.breaker.state != "open"]


def backoff_s(attempt: int, base_s: float, cap_s: float = 2.0) -> float:
    """Exponential backoff between rounds of connection attempts: base, 2*base, ... cap."""
    return float(min(cap_s, base_s * 2**attempt))
