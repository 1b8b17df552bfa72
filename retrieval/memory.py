"""Turn memory: embeddings kept in SQL and mirrored into a per-user vector index.

Invariant: every vector in the index is also in SQL (`message_embeddings`). The index
is loaded per user on first use and reconciled with SQL then (missing ids added from
stored vectors, extra ids removed), so a lost, stale or corrupt file never means lost
memories and never needs the embedder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

import numpy as np
import structlog

from retrieval.errors import EmbeddingModelMismatchError
from retrieval.protocols import Embedder, ScoredId, VectorIndex
from storage.models import Message
from storage.repository import Store, StoredVector

log = structlog.get_logger(__name__)

REPAIR_BATCH_SIZE = 256


def text_for_embedding(message: Message) -> str:
    return message.content


class TurnMemory:
    def __init__(self, store: Store, embedder: Embedder, index: VectorIndex) -> None:
        self._store = store
        self._embedder = embedder
        self._index = index
        self._scope_locks: dict[int, asyncio.Lock] = {}

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    async def check_model(self) -> None:
        """Refuse to mix vectors of different models: the fix is a full reindex."""
        wanted = (self._embedder.model_name, self._embedder.dimension)
        for model, dimension in await self._store.list_embedding_models():
            if (model, dimension) != wanted:
                raise EmbeddingModelMismatchError(
                    f"stored vectors were made by {model!r} (dimension {dimension}) but the "
                    f"configured embedder is {wanted[0]!r} (dimension {wanted[1]}); "
                    "run `memchat reindex` to re-embed every stored turn"
                )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.to_thread(self._embedder.embed, list(texts))

    async def ensure_scope(self, user_pk: int) -> None:
        if self._index.is_loaded(user_pk):
            return
        lock = self._scope_locks.setdefault(user_pk, asyncio.Lock())
        async with lock:
            if self._index.is_loaded(user_pk):
                return
            result = self._index.load(user_pk)
            sql_ids = await self._store.list_user_vector_ids(user_pk)
            extra = result.ids - sql_ids
            missing = sql_ids - result.ids
            self._index.remove(user_pk, extra)
            if missing:
                stored = await self._store.list_user_vectors(user_pk, missing)
                self._add_stored(user_pk, stored)
            if result.status != "loaded" or extra or missing:
                log.info(
                    "index_scope_reconciled",
                    scope=user_pk,
                    status=result.status,
                    num_added=len(missing),
                    num_removed=len(extra),
                )

    def _add_stored(self, user_pk: int, stored: Sequence[StoredVector]) -> None:
        if not stored:
            return
        matrix = np.stack([np.frombuffer(item.vector, dtype=np.float32) for item in stored])
        self._index.add(user_pk, [item.message_id for item in stored], matrix)

    async def index_messages(
        self, messages: Sequence[Message], vectors: np.ndarray | None = None
    ) -> None:
        """Embed (unless given vectors), store the vectors in SQL, then add them to the index."""
        if not messages:
            return
        if vectors is None:
            vectors = await self.embed([text_for_embedding(m) for m in messages])
        stored = [
            StoredVector(m.id, m.user_pk, np.asarray(v, dtype=np.float32).tobytes())
            for m, v in zip(messages, vectors, strict=True)
        ]
        await self._store.save_embeddings(
            self._embedder.model_name, self._embedder.dimension, stored
        )
        for user_pk in sorted({m.user_pk for m in messages}):
            await self.ensure_scope(user_pk)
            self._add_stored(user_pk, [s for s in stored if s.user_pk == user_pk])

    async def search(
        self, user_pk: int, vector: np.ndarray, k: int, exclude: Collection[int] = ()
    ) -> list[ScoredId]:
        await self.ensure_scope(user_pk)
        return self._index.search(user_pk, vector, k, exclude)

    async def forget(self, user_pk: int, message_ids: Collection[int]) -> None:
        """Drop vectors of messages already deleted from SQL."""
        await self.ensure_scope(user_pk)
        self._index.remove(user_pk, message_ids)

    async def repair_unembedded(self) -> int:
        """Embed and index messages that were stored without a vector (crash recovery)."""
        num_repaired = 0
        while batch := await self._store.list_unembedded_messages(REPAIR_BATCH_SIZE):
            await self.index_messages(batch)
            num_repaired += len(batch)
        if num_repaired:
            log.info("unembedded_messages_repaired", num_messages=num_repaired)
        return num_repaired

    async def reindex_all(self) -> int:
        """Re-embed every stored message with the configured model and rebuild the index."""
        await self._store.delete_all_embeddings()
        self._index.drop_all()
        num_messages = 0
        after_id = 0
        while batch := await self._store.list_messages_after_id(after_id, REPAIR_BATCH_SIZE):
            await self.index_messages(batch)
            num_messages += len(batch)
            after_id = batch[-1].id
        self.save()
        return num_messages

    def save(self) -> None:
        self._index.save()
