"""Sessions as the chat sees them: one turn (or import, or deletion) at a time each, and
their creation and deletion across SQL and the derived indexes."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

from retrieval.chat.config import ChatConfig
from retrieval.errors import InvalidInputError, SessionBusyError
from retrieval.prompt.reuse import PrefixTracker
from retrieval.search.memory import TurnMemory
from storage.errors import LockTimeoutError, NotFoundError
from storage.locks import SessionLockRepository
from storage.records import Session, User
from storage.sessions import SessionRepository, SessionState, TurnState

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
    ) -> None:
        self._sessions = sessions
        self._memory = memory
        self._locks = locks
        self._prefixes = prefixes
        self._config = config

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

    async def delete(self, session_id: str, *, tenant_id: int) -> None:
        """The session's rows, then its turns' vectors and terms."""
        state = await session_of_tenant(self._sessions, session_id, tenant_id)
        async with self._locks.hold(session_id):
            ids = await self._sessions.delete_session(session_id)
            await self._memory.forget(state.user.id, ids)
            self._prefixes.forget(session_id)
