"""The second dense list of turns: a multilingual model beside the first (English) one.

Its vectors are stored in SQL under its own model name (the model, and the text recipe
unless raw) and kept in a vector index of their own, scope by scope as the first list's.
A turn indexed now gets both vectors in one SQL transaction; a store indexed before the
second list was added is completed in the background (`retrieval.search.backfill`), and
until every turn of a user holds the second vector, that user's searches leave the list
out (`is_ready`): a search is then what it was before, never one over part of the turns.

A query's second vector is kept by text for a while (the same text always gives the same
vector): a turn embeds its message once, with its own vectors, and the search that
follows finds it here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retrieval.dense import SecondDense
from retrieval.indexes.reconcile import reconcile
from retrieval.protocols import VectorIndex
from retrieval.search.indexed_text import TextRecipe, embed_turns
from retrieval.search.pieces import QueryVectors, embed_queries
from storage.embeddings import EmbeddingRepository, StoredVector
from storage.records import Turn

# Query vectors kept (whole queries and their pieces), by text.
QUERY_CACHE = 256


async def add_stored(index: VectorIndex, user_pk: int, stored: Sequence[StoredVector]) -> None:
    if not stored:
        return
    matrix = np.stack([np.frombuffer(item.vector, dtype=np.float32) for item in stored])
    await index.add(user_pk, [item.message_id for item in stored], matrix)


class SecondList:
    def __init__(
        self, parts: SecondDense, recipe: TextRecipe, embeddings: EmbeddingRepository
    ) -> None:
        self.embedder = parts.embedder
        self.index = parts.index
        self._recipe = recipe
        self._embeddings = embeddings
        # Users whose open scope holds a second vector of every turn it holds.
        self._ready: set[int] = set()
        self._queries = QueryVectors(QUERY_CACHE)

    @property
    def model(self) -> str:
        """The name stored with each vector: the model, and the text recipe unless raw."""
        return self._recipe.stored_name(self.embedder.model_name)

    def is_ready(self, user_pk: int) -> bool:
        return user_pk in self._ready

    def forget_user(self, user_pk: int) -> None:
        self._ready.discard(user_pk)

    def forget_all(self) -> None:
        self._ready.clear()

    async def embed_turns(self, turns: Sequence[Turn], ordered: list[Turn]) -> np.ndarray:
        """The vectors of `turns` (`ordered`: them with their context, in session order)."""
        return await embed_turns(self.embedder.embed, self._recipe, turns, ordered)

    async def embed_query(self, query: str, pieces: Sequence[str] = ()) -> None:
        """Embed a (searched) query and its pieces (retrieval/search/pieces.py) in one
        call, unless their vectors are kept."""
        if missing := self._queries.missing([query, *pieces]):
            self._queries.put(missing, await self._embed_queries(missing))

    async def query_vector(self, query: str) -> np.ndarray:
        return (await self._queries.of([query], self._embed_queries))[0]

    async def query_vectors(
        self, query: str, pieces: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The query's vector and its pieces' (a matrix, no rows without pieces)."""
        vectors = await self._queries.of([query, *pieces], self._embed_queries)
        return vectors[0], vectors[1:]

    async def _embed_queries(self, texts: list[str]) -> np.ndarray:
        return await embed_queries(self.embedder, texts)

    async def open(self, user_pk: int, first_ids: set[int]) -> None:
        """Load the user's scope and make it hold what SQL holds (`reconcile`)."""

        async def add(missing: set[int]) -> None:
            stored = await self._embeddings.list_user_vectors(user_pk, self.model, missing)
            await add_stored(self.index, user_pk, stored)

        sql_ids = await self._embeddings.list_user_vector_ids(user_pk, self.model)
        await reconcile(self.index, user_pk, sql_ids, add, event="index_scope_reconciled")
        self._mark(user_pk, first_ids, sql_ids)

    async def catch_up(self, user_pk: int, first_ids: set[int]) -> None:
        """An open scope made to hold what SQL holds (what other processes stored or
        deleted since), its vectors read from SQL."""
        sql_ids = await self._embeddings.list_user_vector_ids(user_pk, self.model)
        have = await self.index.list_ids(user_pk)
        await self.index.remove(user_pk, have - sql_ids)
        if missing := sql_ids - have:
            stored = await self._embeddings.list_user_vectors(user_pk, self.model, missing)
            await add_stored(self.index, user_pk, stored)
        self._mark(user_pk, first_ids, sql_ids)

    async def took(self, user_pk: int, stored: Sequence[StoredVector], first_ids: set[int]) -> None:
        """An open scope given the vectors just stored for it."""
        await add_stored(self.index, user_pk, stored)
        self._mark(user_pk, first_ids, await self.index.list_ids(user_pk))

    def _mark(self, user_pk: int, first_ids: set[int], second_ids: set[int]) -> None:
        """Search the user's list only once it holds a vector of every turn."""
        if first_ids <= second_ids:
            self._ready.add(user_pk)
        else:
            self._ready.discard(user_pk)
