"""Importing existing history into a session: stored, embedded and indexed when the call
returns, idempotent by `external_id`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from retrieval.chat.config import ChatConfig, check_text
from retrieval.chat.sessions import SessionLocks, session_of_tenant
from retrieval.errors import InvalidInputError, TooLargeError
from retrieval.protocols import Engine
from retrieval.search.memory import TurnMemory
from retrieval.stages import stage
from storage.messages import MessageRepository
from storage.records import NewTurn
from storage.sessions import SessionRepository


class HistoryImport:
    def __init__(
        self,
        sessions: SessionRepository,
        messages: MessageRepository,
        memory: TurnMemory,
        engine: Engine,
        locks: SessionLocks,
        config: ChatConfig,
        *,
        on_new_messages: Callable[[int], None] | None = None,
        on_import: Callable[[int, int], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self._messages = messages
        self._memory = memory
        self._engine = engine
        self._locks = locks
        self._config = config
        self._on_new_messages = on_new_messages or (lambda _user_pk: None)
        # Told each finished import's (imported, skipped) counts (the app counts them).
        self._on_import = on_import or (lambda _imported, _skipped: None)

    def check_count(self, num_messages: int) -> None:
        """Refuse more messages than one import takes (checked before any other work)."""
        if num_messages > self._config.max_import_messages:
            raise InvalidInputError(
                "messages",
                f"{num_messages} messages in one import; the limit is "
                f"{self._config.max_import_messages}",
            )

    def check(self, messages: Sequence[NewTurn]) -> None:
        """Refuse an import over its limits (count, each message, all characters)."""
        self.check_count(len(messages))
        for position, item in enumerate(messages):
            check_text(
                item.content, f"messages[{position}].content", self._config.max_content_chars
            )
        num_chars = sum(len(m.content) for m in messages)
        if num_chars > self._config.max_import_chars:
            raise TooLargeError(
                "messages",
                f"the messages hold {num_chars} characters together; one import takes at "
                f"most {self._config.max_import_chars} (split it into several)",
            )

    async def run(
        self, session_id: str, messages: Sequence[NewTurn], *, tenant_id: int
    ) -> tuple[int, int]:
        """Store and index existing history; returns (imported, skipped as duplicates)."""
        self.check(messages)
        with stage("import", session_id=session_id, num_messages=len(messages)) as importing:
            state = await session_of_tenant(self._sessions, session_id, tenant_id)
            counted = [
                replace(m, token_count=await self._engine.count_tokens(m.content)) for m in messages
            ]
            async with self._locks.hold(session_id):
                with stage("persist", num_messages=len(counted)):
                    result = await self._messages.append(state.session, counted)
                    await self._memory.index(result.turns, fresh=True)
            importing.record(num_imported=len(result.turns), num_skipped=result.num_skipped)
        if result.turns:
            self._on_new_messages(state.user.id)
        self._on_import(len(result.turns), result.num_skipped)
        return len(result.turns), result.num_skipped
