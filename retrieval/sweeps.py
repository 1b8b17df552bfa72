"""Periodic sweeps for background work: each API process looks in SQL, now and then, for
work that is due (a user's messages ahead of their fact watermark, a document left
`processing`), so that work another process was told of, or was doing when it was
killed, is done by whichever process is still running."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from storage.errors import StorageError

log = structlog.get_logger(__name__)


async def sweep_every(
    interval_s: float, sweep: Callable[[], Awaitable[object]], *, event: str
) -> None:
    """Run `sweep` every `interval_s` seconds until cancelled. A database that fails a
    round is logged as `event`; the next round tries again."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await sweep()
        except StorageError as exc:
            log.warning(event, error=str(exc))
