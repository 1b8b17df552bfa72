"""Fact extraction off the request path: turns and imports only mark a user as having
new messages; one background task extracts, user by user, in message order.

The watermark in SQL makes the queue durable: at start, and then every sweep interval,
every user whose messages are ahead of their watermark is queued again, so a crash delays
extraction and loses none, and work that another API process was told of (or was doing
when it was killed) is found by this one. Each batch is claimed in the database
(`FactMemory.extract_pending`): a user whose extraction another process holds is skipped
now and tried again after `RETRY_DELAY_S`, when that process has usually read them all.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from retrieval.errors import RetrievalError
from retrieval.facts.memory import FactMemory
from retrieval.sweeps import sweep_every
from storage.errors import NotFoundError, StorageError

log = structlog.get_logger(__name__)

RETRY_DELAY_S = 5.0


class FactWorker:
    def __init__(self, memory: FactMemory, *, sweep_interval_s: float) -> None:
        """`sweep_interval_s`: how often users behind their watermark are queued again
        (0: only at start)."""
        self._memory = memory
        self._sweep_interval_s = sweep_interval_s
        self._pending: dict[int, None] = {}  # insertion-ordered set of user ids
        self._retries: dict[int, asyncio.TimerHandle] = {}
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.sweep()
        self._tasks.append(asyncio.create_task(self._run(), name="fact-extraction"))
        if self._sweep_interval_s > 0:
            sweeper = sweep_every(self._sweep_interval_s, self.sweep, event="fact_sweep_failed")
            self._tasks.append(asyncio.create_task(sweeper, name="fact-sweep"))

    async def stop(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        self._retries.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def sweep(self) -> None:
        """Queue every user whose messages are ahead of their watermark."""
        for user_pk in await self._memory.list_users_behind():
            self.notify(user_pk)

    def notify(self, user_pk: int) -> None:
        """The user has new messages to read for facts."""
        self._pending[user_pk] = None
        self._idle.clear()
        self._wakeup.set()

    async def drain(self) -> None:
        """Wait until every user notified so far has been processed, or found held by
        another process (which reads them; this one tries again later)."""
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
            num_read = await self._memory.extract_pending(user_pk)
        except NotFoundError:
            return  # the user was erased meanwhile
        except (StorageError, RetrievalError) as exc:
            # The watermark did not move: the messages are read again on the retry.
            log.warning("fact_extraction_failed", user_pk=user_pk, error=str(exc))
            await asyncio.sleep(RETRY_DELAY_S)
            self._pending[user_pk] = None
            return
        if num_read is None:
            self._retry_later(user_pk)

    def _retry_later(self, user_pk: int) -> None:
        """Queue the user again in `RETRY_DELAY_S` (another process held their batch)."""
        if user_pk in self._retries:
            return

        def retry() -> None:
            del self._retries[user_pk]
            self.notify(user_pk)

        self._retries[user_pk] = asyncio.get_running_loop().call_later(RETRY_DELAY_S, retry)
