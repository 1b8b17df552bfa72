"""Sessions as the chat sees them: one turn (or import, or deletion) at a time each, and
their creation and deletion across SQL and the derived indexes."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

from retrieval.chat.config import ChatConfig
from retrieval.errors import InvalidInputError, SessionBusyError
from retrieval.prompt.render import MEMORY_HEADER, format_fact, format_memory, note_of
from retrieval.prompt.reuse import PrefixTracker
from retrieval.search.memory import TurnMemory
from retrieval.turns import SearchHit
from storage.errors import LockTimeoutError, NotFoundError
from storage.locks import SessionLockRepository
from storage.records import Fact, Session, Turn, User
from storage.sessions import DeletedSession, SessionRepository, SessionState, TurnState

_State = TypeVar("_State", bound=SessionState)


class SessionLocks:
    """A lock per session: each turn's context sees every earlier turn, reply included.

    In this process an asyncio lock; with `shared` (PostgreSQL, several processes on one
    database) also the database's lock of the session, taken after the asyncio one, so a
    process has at most one hold per session waiting on the database (one connection).
    A shared lock not granted in time raises `SessionBusyError`, before anything is stored.

    Weak values: a lock lives while a turn holds or awaits it, so unknown ids leave
    nothing behind.
    """

    def __init__(self, shared: SessionLockRepository | None = None) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._shared = shared

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[session_id] = lock
        async with lock, AsyncExitStack() as held:
            if self._shared is not None:
                try:
                    await held.enter_async_context(self._shared.hold(session_id))
                except LockTimeoutError as exc:
                    raise SessionBusyError(session_id, exc.timeout_s) from exc
            yield


async def session_of_tenant(
    sessions: SessionRepository, session_id: str, tenant_id: int
) -> SessionState:
    """The session with its user and summary; another tenant's is as missing as none
    (the same 404, so ids reveal nothing across tenants)."""
    return of_tenant(await sessions.get_state(session_id), tenant_id)


async def turn_state_of_tenant(
    sessions: SessionRepository, session_id: str, tenant_id: int
) -> TurnState:
    """As `session_of_tenant`, with what a turn reads with it (`get_turn_state`)."""
    return of_tenant(await sessions.get_turn_state(session_id), tenant_id)


def of_tenant(state: _State, tenant_id: int) -> _State:
    if state.user.tenant_id != tenant_id:
        raise NotFoundError("session", state.session.id)
    return state


class ChatSessions:
    def __init__(
        self,
        sessions: SessionRepository,
        memory: TurnMemory,
        locks: SessionLocks,
        prefixes: PrefixTracker,
        config: ChatConfig,
        *,
        note_tokens: Callable[[str], Awaitable[int]],
    ) -> None:
        self._sessions = sessions
        self._memory = memory
        self._locks = locks
        self._prefixes = prefixes
        self._config = config
        self._note_tokens = note_tokens

    async def create(
        self, user_id: str, title: str | None, metadata: Mapping[str, Any], *, tenant_id: int
    ) -> tuple[Session, User]:
        size = len(json.dumps(metadata, ensure_ascii=False).encode("utf-8"))
        if size > self._config.max_metadata_bytes:
            raise InvalidInputError(
                "metadata",
                f"metadata takes {size} bytes as JSON; the limit is "
                f"{self._config.max_metadata_bytes}",
            )
        return await self._sessions.create_session(
            user_id, title, dict(metadata), tenant_id=tenant_id
        )

    async def delete(self, session_id: str, *, tenant_id: int) -> DeletedSession:
        """Everything that holds the session's text goes: in one SQL transaction its rows,
        the facts drawn only from it (retired, their text redacted) and its turns and
        those facts in the stored contexts of the user's other messages
        (`SessionRepository.delete_session`); then its turns' vectors and terms, saved
        at once (`TurnMemory.forget`). The rewritten contexts' token counts follow."""
        state = await session_of_tenant(self._sessions, session_id, tenant_id)
        async with self._locks.hold(session_id):
            deleted = await self._sessions.delete_session(session_id, scrub=without_deleted)
            await self._memory.forget(state.user.id, deleted.message_ids)
            self._prefixes.forget(session_id)
            counts = {}
            for message_id, other_session, note in deleted.rewritten:
                self._prefixes.forget(other_session)
                if note:
                    counts[message_id] = await self._note_tokens(note[0])
            await self._sessions.set_note_tokens(counts)
        return deleted


def without_deleted(turn: Turn, turns: Sequence[Turn], facts: Sequence[Fact]) -> list[str] | None:
    """The context `turn` was sent with, less the lines of the deleted `turns` and the
    retired `facts` it shows (a line per item: `retrieval/prompt/render.py`), and less the
    days and sections they leave empty; None when nothing is left, or when the context
    is not of the current format or a line to remove is not found in it (then the whole
    context goes: nothing of a deleted session may stay)."""
    note = note_of(turn)
    if not note:
        return None
    gone = Counter(format_memory(SearchHit(t, 0.0)) for t in turns)
    gone.update(format_fact(f) for f in facts)
    head, *sections, tail = note.split("\n\n")
    kept = []
    for section in sections:
        header, *lines = section.split("\n")
        left = []
        for line in lines:
            if gone[line] > 0:
                gone[line] -= 1
            else:
                left.append(line)
        if header == MEMORY_HEADER:
            left = _without_empty_days(left)
        if left:
            kept.append("\n".join([header, *left]))
    if +gone or not kept:
        return None
    return ["\n\n".join([head, *kept, tail])]


def _without_empty_days(lines: Sequence[str]) -> list[str]:
    """Memory lines under their days, less the days left with none."""
    kept: list[str] = []
    for line in lines:
        if kept and not kept[-1].startswith("- ") and not line.startswith("- "):
            kept.pop()  # the previous day had no memory left
        kept.append(line)
    if kept and not kept[-1].startswith("- "):
        kept.pop()
    return kept
