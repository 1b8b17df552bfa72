"""A client's conversation as it sends it: whole or only its new message.

Clients of chat-completion APIs either send only the new message (the service holds the
history) or resend the whole conversation every turn. Both are taken: the messages the
client sends before its new one are matched against the session's last stored messages,
and only what the session does not hold yet is stored (through `HistoryImport`), before
the new message goes through the same `ChatTurn` as any other turn, memories, pinned
facts and summary included.

Matching: the longest run at the start of the client's history that equals the
session's last messages (role and text, surrounding white space ignored) is already
stored; the rest is new. A client that trims old messages still matches (its history
starts later in the session); one that retries a turn whose reply failed (the session
ends with the same user message, unanswered) matches the messages before it. A
history is at most one import long (`max_import_messages`, refused before anything is
read), so a whole conversation resent costs one bounded read and a linear match.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from retrieval.chat.events import TurnEvent
from retrieval.chat.history import HistoryImport
from retrieval.chat.sessions import session_of_tenant
from retrieval.chat.turn import ChatTurn
from retrieval.errors import InvalidInputError
from retrieval.protocols import ChatMessage, SamplingParams
from storage.errors import ConflictError, NotFoundError
from storage.messages import MessageRepository
from storage.records import NewTurn, Session, Turn
from storage.sessions import SessionRepository

# Derived session ids (a conversation named by its first message) live in this namespace.
CONVERSATION_NAMESPACE = uuid.UUID("6f1d7c36-8a0e-4f57-9a43-3c1f4bd1e2a7")


@dataclass(frozen=True, slots=True)
class ClientTurn:
    """What the conversation's turn did before its reply: the session, and how many of
    the client's earlier messages were new to it (stored before the turn)."""

    session: Session
    num_stored: int


def conversation_id(tenant_id: int, user_id: str, first_message: str) -> str:
    """The session id of a conversation that the client does not name: derived from its
    user and its first user message, so that a client resending the whole conversation
    lands in the same session every turn."""
    return str(uuid.uuid5(CONVERSATION_NAMESPACE, f"{tenant_id}\n{user_id}\n{first_message}"))


def _key(message: Turn | ChatMessage) -> tuple[str, str]:
    return message.role, message.content.strip()


def _overlap(stored: Sequence[Turn], sent: Sequence[ChatMessage]) -> int:
    """How many of `sent`'s first messages are the last messages of `stored`.

    Knuth-Morris-Pratt over the messages' keys: the longest prefix of `sent` that ends
    `stored`, in time linear in both (each key compared a bounded number of times),
    where trying every size would be quadratic."""
    pattern = [_key(m) for m in sent[: len(stored)]]
    if not pattern:
        return 0
    # fallback[i]: the longest proper prefix of pattern[: i + 1] that also ends it.
    fallback = [0] * len(pattern)
    size = 0
    for position in range(1, len(pattern)):
        while size and pattern[position] != pattern[size]:
            size = fallback[size - 1]
        if pattern[position] == pattern[size]:
            size += 1
        fallback[position] = size
    size = 0
    for message in stored[len(stored) - len(pattern) :]:
        key = _key(message)
        if size == len(pattern):
            size = fallback[size - 1]
        while size and key != pattern[size]:
            size = fallback[size - 1]
        if key == pattern[size]:
            size += 1
    return size


def new_part(
    stored: Sequence[Turn], history: Sequence[ChatMessage], new_message: str
) -> list[ChatMessage]:
    """The messages of the client's `history` that the session does not hold."""
    if not history:
        return []
    if not stored:
        return list(history)
    found = _overlap(stored, history)
    last = stored[-1]
    if found < len(history) and last.role == "user" and last.content.strip() == new_message.strip():
        # A retried turn: its message is stored, its reply is not.
        found = max(found, _overlap(stored[:-1], history))
    return list(history[found:])


class ClientConversation:
    def __init__(
        self,
        sessions: SessionRepository,
        messages: MessageRepository,
        history: HistoryImport,
        turns: ChatTurn,
    ) -> None:
        self._sessions = sessions
        self._messages = messages
        self._history = history
        self._turns = turns

    async def open(self, session_id: str, user_id: str, *, tenant_id: int) -> Session:
        """The session of this id, created for the user on first use; another user's
        session conflicts."""
        try:
            state = await session_of_tenant(self._sessions, session_id, tenant_id)
        except NotFoundError:
            try:
                chat, _ = await self._sessions.create_session(
                    user_id, None, {}, tenant_id=tenant_id, session_id=session_id
                )
                return chat
            except ConflictError:
                # Created at the same moment by a concurrent request, or another tenant's.
                state = await session_of_tenant(self._sessions, session_id, tenant_id)
        if state.user.external_id != user_id:
            raise ConflictError(f"session {session_id} belongs to another user")
        return state.session

    async def run(
        self,
        session_id: str,
        user_id: str,
        history: Sequence[ChatMessage],
        new_message: str,
        params: SamplingParams,
        *,
        tenant_id: int,
        instructions: str = "",
    ) -> tuple[ClientTurn, AsyncGenerator[TurnEvent]]:
        """Store the part of `history` the session lacks, then the turn's events (the
        generator is not started: the caller runs it). `instructions`: the client's
        system message, placed after the service's own prompt.

        A history longer than one import is refused before the session is read: the
        stored messages read are at most one more than the client sent, and matching
        them is linear."""
        self._history.check_count(len(history))
        for position, message in enumerate(history):
            if message.role not in ("user", "assistant"):
                raise InvalidInputError(
                    f"messages[{position}].role", "only user and assistant messages are stored"
                )
        chat = await self.open(session_id, user_id, tenant_id=tenant_id)
        stored = await self._messages.list_last_messages(chat.id, len(history) + 1)
        missing = new_part(stored, history, new_message)
        if missing:
            await self._history.run(
                chat.id,
                [NewTurn(role=m.role, content=m.content) for m in missing],
                tenant_id=tenant_id,
            )
        events = self._turns.run(
            chat.id, new_message, params, tenant_id=tenant_id, instructions=instructions
        )
        return ClientTurn(chat, len(missing)), events
