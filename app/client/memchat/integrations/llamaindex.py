"""memchat as LlamaIndex memory (`pip install memchat-client[llamaindex]`):

- `MemchatRetriever`, a `BaseRetriever` over `POST /v1/memory/search`: past turns,
  facts and knowledge of one user as scored nodes, each with its kind, id and time;
- `MemchatMemoryBlock`, a long-term block of LlamaIndex's `Memory`: the messages the
  short-term memory flushes are stored in a memchat session, and each read is what
  memchat finds for the latest messages, across all of the user's sessions.
"""

from __future__ import annotations

from typing import Any

import msgspec

from memchat.client import AsyncMemchatClient, MemchatClient
from memchat.types import HistoryMessage, Kind, Memory, Role

try:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.memory import BaseMemoryBlock
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from pydantic import ConfigDict, Field
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "memchat.integrations.llamaindex needs llama-index-core: "
        "pip install 'memchat-client[llamaindex]'"
    ) from exc

# What a node shows the LLM of its metadata: the kind and the time, not the ids.
_HIDDEN_FROM_LLM = ["id", "session_id", "external_id", "document_id", "score", "source_message_ids"]
_BLOCK_KINDS: list[Kind] = ["turn", "fact"]
_ROLES: dict[MessageRole, Role] = {
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.SYSTEM: "system",
}


def memory_node(memory: Memory) -> NodeWithScore:
    """A search result as a scored node: its text, and in `metadata` every other field
    of the result (`kind`, `id`, `score`, `created_at` as ISO 8601 where it has one)."""
    metadata: dict[str, Any] = msgspec.to_builtins(memory)
    text = metadata.pop("text")
    node = TextNode(
        id_=f"memchat-{metadata['kind']}-{memory.id}",
        text=text,
        metadata=metadata,
        excluded_llm_metadata_keys=_HIDDEN_FROM_LLM,
        excluded_embed_metadata_keys=list(metadata),
    )
    return NodeWithScore(node=node, score=memory.score)


class MemchatRetriever(BaseRetriever):
    """One user's memory, best first: `k` results of `kinds` (`turn`, `fact`,
    `knowledge`), across all of their sessions or in `session_id` only. `async_client`,
    if given, serves `aretrieve`."""

    def __init__(
        self,
        client: MemchatClient,
        user_id: str,
        *,
        k: int = 4,
        kinds: list[Kind] | None = None,
        session_id: str | None = None,
        async_client: AsyncMemchatClient | None = None,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        super().__init__(callback_manager=callback_manager)
        self.client = client
        self.async_client = async_client
        self.user_id = user_id
        self.k = k
        self.kinds: list[Kind] = kinds or ["turn"]
        self.session_id = session_id

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        found = self.client.search_memory(
            self.user_id,
            query_bundle.query_str,
            k=self.k,
            session_id=self.session_id,
            kinds=self.kinds,
        )
        return [memory_node(m) for m in found]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.async_client is None:
            return self._retrieve(query_bundle)
        found = await self.async_client.search_memory(
            self.user_id,
            query_bundle.query_str,
            k=self.k,
            session_id=self.session_id,
            kinds=self.kinds,
        )
        return [memory_node(m) for m in found]


def _history_message(message: ChatMessage) -> HistoryMessage | None:
    role = _ROLES.get(message.role)
    text = message.content
    if role is None or not text:
        return None  # tool and function messages, and messages without text
    return HistoryMessage(role, text)


class MemchatMemoryBlock(BaseMemoryBlock[str]):
    """Long-term memory in memchat. Messages flushed from the short-term memory are
    stored in `session_id` (a memchat session of `user_id`); a read searches the user's
    memory with the text of the last `num_query_messages` messages and shows the `k`
    best results of `kinds`, one line each, oldest time first."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = "memchat"
    description: str | None = "What memchat remembers of the user"
    client: AsyncMemchatClient = Field(exclude=True)
    user_id: str
    session_id: str
    k: int = 5
    kinds: list[Kind] = Field(default_factory=lambda: list(_BLOCK_KINDS))
    num_query_messages: int = 2

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        recent = [m.content for m in (messages or [])[-self.num_query_messages :] if m.content]
        if not recent:
            return ""
        found = await self.client.search_memory(
            self.user_id, "\n".join(recent), k=self.k, kinds=self.kinds
        )
        return "\n".join(_line(m) for m in found)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        history = [h for h in map(_history_message, messages) if h is not None]
        if history:
            await self.client.import_history(self.session_id, history)


def _line(memory: Memory) -> str:
    when = getattr(memory, "created_at", None)
    stamp = f"[{when:%Y-%m-%d}] " if when is not None else ""
    return f"- {stamp}{memory.text}"
