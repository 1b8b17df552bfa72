"""Fact extraction off the request path: turns and imports only mark a user as having
new messages; one background task extracts, user by user, in message order.

The watermark in SQL makes the queue durable: at start every user whose messages are
ahead of their watermark is queued again, so a crash delays extraction and loses none.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from retrieval.facts.memory import FactMemory
from storage.errors import NotFoundError, StorageError

log = structlog.get_logger(__name__)

RETRY_DELAY_S = 5.0


class FactWorker:
    def __init__(self, memory: FactMemory) -> None:
        self._memory = memory
        self._pending: dict[int, None] = {}  # insertion-ordered set of user ids
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for user_pk in await self._memory.list_users_behind():
            self.notify(user_pk)
        self._task = asyncio.create_task(self._run(), name="fact-extraction")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def notify(self, user_pk: int) -> None:
        """The user has new messages to read for facts."""
        self._pending[user_pk] = None
        self._idle.clear()
        self._wakeup.set()

    async def drain(self) -> None:
        """Wait until every user notified so far has been processed."""
        await self._idle.wait()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                user_pk = next(iter(self._pending))
                del self._pending[user_pk]
                await self._extract(user_pk)
            if not self._pending:
                self._idle.set()

    async def _extract(self, user_pk: int) -> None:
        try:
            await self._memory.extract_pending(user_pk)
        except NotFoundError:
            return  # the user was erased meanwhile
        except StorageError as exc:
            # The watermark did not move: the messages are read again on the retry.
            log.warning("fact_extraction_failed", user_pk=user_pk, error=str(exc))
            await asyncio.sleep(RETRY_DELAY_S)
            self._pending[user_pk] = None
