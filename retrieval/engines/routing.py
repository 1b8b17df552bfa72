"""Who a generation is for, so that an engine with replicas can keep a user on one of them.

The chat service sets `current_route` before a turn's generation; engines without
replicas ignore it. A context variable rather than a parameter keeps the `Engine`
protocol the same for every adapter.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    """`key` picks the replica (the user); `tenant` scopes the prefix cache (the tenant)."""

    key: str
    tenant: str | None = None


current_route: ContextVar[Route | None] = ContextVar("memchat_engine_route", default=None)
