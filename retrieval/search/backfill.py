"""Completing the second dense list of a store indexed before it was added.

A store whose turns hold only the first embedder's vectors (made before the multilingual
list became the default, or with it off) is served at once: each user's searches use the
first list and BM25 until every turn of theirs holds the second vector too
(`TurnMemory.search`). Meanwhile this job embeds the missing vectors in the background,
user by user, a batch at a time, each batch stored as it is made: a process stopped
midway resumes where it stopped. With several processes on one PostgreSQL database, each
user's turns are claimed first (`storage.claims`): a user another process is completing
is left to it, and no turn is embedded twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import structlog

from retrieval.errors import RetrievalError
from retrieval.search.memory import TurnMemory
from storage.claims import SECOND_VECTORS, JobClaimRepository, int4_key
from storage.errors import StorageError

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """Turns holding the second list's vector (`done`) of those holding the first's."""

    done: int
    total: int
    running: bool

    @property
    def is_complete(self) -> bool:
        return self.done >= self.total

    def as_dict(self) -> dict[str, object]:
        share = 1.0 if not self.total else round(min(self.done / self.total, 1.0), 4)
        return {
            "done": self.done,
            "total": self.total,
            "share": share,
            "state": "complete" if self.is_complete else "running" if self.running else "waiting",
        }


class SecondListBackfill:
    def __init__(
        self,
        memory: TurnMemory,
        claims: JobClaimRepository | None,
        *,
        retry_s: float = 10.0,
    ) -> None:
        """`claims`: the database's where processes share it (PostgreSQL); `retry_s`: the
        wait before looking again while turns are missing (another process's claim, an
        error)."""
        self._memory = memory
        self._claims = claims
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self._progress = BackfillProgress(0, 0, running=False)

    @property
    def progress(self) -> BackfillProgress:
        return self._progress

    async def start(self) -> None:
        """Read where the store stands, then complete it in the background if needed."""
        await self._refresh(running=False)
        if not self._progress.is_complete:
            self._task = asyncio.create_task(self._run(), name="second-list-backfill")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._claims is not None:
            await self._claims.dispose()

    async def run(self) -> int:
        """Embed what is missing now (in the caller's task); returns how many turns."""
        started = time.perf_counter()
        num_embedded = await self._memory.backfill_second(self.hold, self._advance)
        await self._refresh(running=False)
        if num_embedded:
            log.info(
                "second_list_backfill_pass",
                num_turns=num_embedded,
                seconds=round(time.perf_counter() - started, 1),
                **self._progress.as_dict(),
            )
        return num_embedded

    async def _run(self) -> None:
        while True:
            try:
                await self._refresh(running=True)
                await self._memory.backfill_second(self.hold, self._advance)
                await self._refresh(running=False)
            except (RetrievalError, StorageError) as exc:  # a database or index away: later
                log.warning("second_list_backfill_failed", error=str(exc))
                await self._refresh_or_keep()
            except Exception:  # the boundary of a background task: record, try again later
                log.exception("second_list_backfill_crashed")
                await self._refresh_or_keep()
            if self._progress.is_complete:
                log.info("second_list_complete", **self._progress.as_dict())
                return
            await asyncio.sleep(self._retry_s)

    async def _refresh_or_keep(self) -> None:
        """The progress read again after a failure, if the database answers."""
        with suppress(RetrievalError, StorageError):
            await self._refresh(running=False)
            return
        self._progress = BackfillProgress(self._progress.done, self._progress.total, False)

    async def _refresh(self, *, running: bool) -> None:
        counts = await self._memory.second_progress()
        done, total = counts if counts is not None else (0, 0)
        self._progress = BackfillProgress(done, total, running=running)

    def _advance(self, num_turns: int) -> None:
        progress = self._progress
        self._progress = BackfillProgress(progress.done + num_turns, progress.total, running=True)

    @asynccontextmanager
    async def hold(self, user_pk: int) -> AsyncIterator[bool]:
        """Claim a user's turns (always granted without shared claims: SQLite)."""
        if self._claims is None:
            yield True
            return
        async with self._claims.try_hold(SECOND_VECTORS, int4_key(user_pk)) as is_held:
            yield is_held
