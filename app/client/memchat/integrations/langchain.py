"""memchat as LangChain memory (`pip install memchat-client[langchain]`):

- `MemchatChatMessageHistory`, a `BaseChatMessageHistory` over one memchat session: what
  LangChain adds is stored as the session's turns (`POST /v1/sessions/{id}/history`),
  what it reads is the session's stored turns, so `RunnableWithMessageHistory` keeps a
  conversation in memchat, where later turns of the user find it;
- `MemchatRetriever`, a `BaseRetriever` over `POST /v1/memory/search`: past turns, facts
  and knowledge of one user as `Document`s, each with its kind, id, score and time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from memchat.client import AsyncMemchatClient, MemchatClient
from memchat.types import HistoryMessage, Kind, Memory, Message, Role

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.documents import Document
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "memchat.integrations.langchain needs langchain-core: "
        "pip install 'memchat-client[langchain]'"
    ) from exc

_ROLES: dict[str, Role] = {"human": "user", "ai": "assistant", "system": "system"}
_MESSAGES = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}
# The most messages one read of a session asks for (the API's largest page).
_PAGE = 10_000


def _text(message: BaseMessage) -> str:
    """A message's text; of a message in parts, its text parts."""
    if isinstance(message.content, str):
        return message.content
    parts = [
        part if isinstance(part, str) else str(part.get("text", ""))
        for part in message.content
        if isinstance(part, str) or part.get("type") == "text"
    ]
    return "".join(parts)


def _history_message(message: BaseMessage) -> HistoryMessage:
    role = _ROLES.get(message.type)
    if role is None:
        raise ValueError(
            f"memchat stores user, assistant and system messages, not {message.type!r} ones"
        )
    return HistoryMessage(role, _text(message), name=message.name, external_id=message.id)


def _langchain_message(message: Message) -> BaseMessage:
    metadata = {"seq": message.seq, "created_at": msgspec.to_builtins(message.created_at)}
    return _MESSAGES[message.role](
        content=message.content,
        id=str(message.id),
        name=message.name,
        response_metadata=metadata,
    )


class MemchatChatMessageHistory(BaseChatMessageHistory):
    """The stored turns of memchat session `session_id` (made with
    `client.create_session`). A message's LangChain id, if it has one, is stored as its
    `external_id`, so adding it again stores nothing; read back, a message's id is
    memchat's. `async_client`, if given, serves the async methods."""

    def __init__(
        self,
        client: MemchatClient,
        session_id: str,
        *,
        async_client: AsyncMemchatClient | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.async_client = async_client

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # a property, as documented
        stored: list[Message] = []
        while page := self.client.list_messages(
            self.session_id, after_seq=stored[-1].seq if stored else 0, limit=_PAGE
        ):
            stored += page
        return [_langchain_message(m) for m in stored]

    async def aget_messages(self) -> list[BaseMessage]:
        if self.async_client is None:
            return await super().aget_messages()
        stored: list[Message] = []
        while page := await self.async_client.list_messages(
            self.session_id, after_seq=stored[-1].seq if stored else 0, limit=_PAGE
        ):
            stored += page
        return [_langchain_message(m) for m in stored]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.client.import_history(self.session_id, [_history_message(m) for m in messages])

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.async_client is None:
            return await super().aadd_messages(messages)
        await self.async_client.import_history(
            self.session_id, [_history_message(m) for m in messages]
        )
        return None

    def clear(self) -> None:
        """memchat removes a session's turns by deleting the session (from SQL and the
        indexes); the history then goes on in a new session of the same user, whose id
        `session_id` now holds."""
        session = self.client.get_session(self.session_id)
        self.client.delete_session(self.session_id)
        self.session_id = self.client.create_session(
            session.user_id, session.title, session.metadata
        ).id


def memory_document(memory: Memory) -> Document:
    """A search result as a `Document`: its text, and in `metadata` every other field of
    the result (`kind`, `id`, `score`, `created_at` as ISO 8601 where it has one, ...)."""
    metadata: dict[str, Any] = msgspec.to_builtins(memory)
    text = metadata.pop("text")
    return Document(page_content=text, metadata=metadata, id=f"{metadata['kind']}:{memory.id}")


class MemchatRetriever(BaseRetriever):
    """One user's memory, best first: `k` results of `kinds` (`turn`, `fact`,
    `knowledge`), across all of their sessions or in `session_id` only."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: MemchatClient
    user_id: str
    k: int = 4
    kinds: list[Kind] = ["turn"]  # noqa: RUF012  # pydantic copies field defaults
    session_id: str | None = None
    async_client: AsyncMemchatClient | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        found = self.client.search_memory(
            self.user_id, query, k=self.k, session_id=self.session_id, kinds=self.kinds
        )
        return [memory_document(m) for m in found]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        found = await self.async_client.search_memory(
            self.user_id, query, k=self.k, session_id=self.session_id, kinds=self.kinds
        )
        return [memory_document(m) for m in found]
