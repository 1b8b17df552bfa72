"""Turn memory: embeddings kept in SQL and mirrored into a per-user vector index, plus a
per-user lexical (BM25) index, searched together and fused (by standardised scores
or reciprocal rank; see `retrieval.fusion`), the lexical query widened by related
words of the user's own vocabulary (`retrieval.search.expansion`).

Invariant: every vector in the index is also in SQL (`message_embeddings`). The index
is loaded per user on first use and reconciled with SQL then (missing ids added from
stored vectors, extra ids removed), so a lost, stale or corrupt file never means lost
memories and never needs the embedder. The lexical index has no file: it is built from
the user's stored turns on first use and kept in step by `index` and `forget`.

What is indexed for a turn is its indexed text (`retrieval.search.indexed_text`); the
recipe of the dense text is part of the stored model name, so vectors of another recipe
are refused at start like vectors of another model (`memchat reindex` rebuilds them).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import structlog

from retrieval.dense import DenseQuery, SecondDense
from retrieval.errors import EmbeddingModelMismatchError
from retrieval.fusion import (
    drop_near_duplicates,
    reciprocal_rank_fusion,
    standardised_fusion,
)
from retrieval.indexes.files import read_or_none, seal, unseal, write_atomic
from retrieval.indexes.reconcile import reconcile
from retrieval.protocols import (
    Embedder,
    QueryEmbedder,
    ScoredId,
    VectorIndex,
    VocabularyEmbedder,
)
from retrieval.search.expansion import NeighbourConfig, WordNeighbours
from retrieval.search.focus import focus_of
from retrieval.search.indexed_text import (
    TextRecipe,
    dense_texts,
    embed_turns,
    indexed_parts,
    mean_of_pieces,
)
from retrieval.search.lexical import Feedback, LexicalIndex, LexicalScores
from retrieval.search.pieces import PieceScorer, QueryVectors, embed_queries, query_pieces
from retrieval.search.second import SecondList, add_stored
from retrieval.search.trace import SearchTrace
from retrieval.search.when import time_span
from retrieval.stages import stage
from retrieval.text import is_mostly_cjk
from storage.embeddings import EmbeddingRepository, StoredVector, VectorSet
from storage.messages import MessageRepository
from storage.records import Turn

log = structlog.get_logger(__name__)

REPAIR_BATCH_SIZE = 256
WORDS_MAGIC = b"memchat-words-1\n"


def _write_snapshots(
    lexical_path: Path,
    lexical: bytes,
    words_path: Path,
    vocabulary: Mapping[str, np.ndarray],
    tag: str,
) -> None:
    buffer = io.BytesIO()
    arrays: dict[str, Any] = {"tag": np.asarray(tag), **vocabulary}
    np.savez(buffer, **arrays)
    write_atomic(lexical_path, lexical)
    write_atomic(words_path, seal(WORDS_MAGIC, buffer.getvalue()))


def _read_snapshots(
    lexical_path: Path, words_path: Path, tag: str
) -> tuple[bytes | None, dict[str, np.ndarray] | None]:
    """A user's lexical snapshot and vocabulary, the latter only if intact and made with
    `tag` (see `TurnMemory._snapshot_tag`)."""
    lexical = read_or_none(lexical_path)
    payload = unseal(WORDS_MAGIC, read_or_none(words_path) or b"")
    if lexical is None or payload is None:
        return None, None
    try:
        arrays = dict(np.load(io.BytesIO(payload), allow_pickle=False))
    except (ValueError, OSError, EOFError):
        return None, None
    if str(arrays.pop("tag", "")) != tag:
        return None, None
    return lexical, arrays


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    """How turns are indexed and searched. The defaults are the service's (the settings'
    defaults; `tests/test_defaults.py` holds them equal).

    mode: "dense" (vectors only), "lexical" (BM25 only) or "hybrid" (both, each one's
    best `num_candidates` fused: fusion "zscore" by weighted standardised scores, every
    candidate scored by both, or "rrf" by weighted reciprocal rank with constant rrf_c).
    duplicate_threshold: a hit whose terms overlap a better hit's by at least this
    Jaccard share is dropped (above 1: never).
    """

    mode: str = "hybrid"
    dense_text: TextRecipe = field(default_factory=lambda: TextRecipe(speaker=True, window=8))
    lexical_text: TextRecipe = field(
        default_factory=lambda: TextRecipe(speaker=True, date=True, caption=True, previous=2)
    )
    fusion: str = "zscore"
    num_candidates: int = 100
    rrf_c: float = 60.0
    dense_weight: float = 0.7
    # The dense weight for a query mostly in CJK script (0 with an English-only embedder,
    # whose similarities of a memory mostly in CJK script then count for nothing either).
    dense_weight_cjk: float = 0.0
    # The second dense list (a multilingual model's, where the memory has one): what is
    # embedded for a turn, and its weight for a query mostly in CJK script and for others.
    # Its CJK weight applies where the query or the memory is mostly in CJK script.
    second_text: TextRecipe = field(default_factory=TextRecipe)
    second_weight: float = 0.3
    second_weight_cjk: float = 1.5
    lexical_weight: float = 1.0
    # A query of several sentences: a dense list's score of a memory is its similarity
    # to the whole query plus this much of its best similarity to one sentence
    # (retrieval/search/pieces.py; 0: the whole query only).
    piece_weight: float = 1.0
    # A query naming a time (retrieval/search/when.py): the turns said then join the
    # candidates and this much is added to their fused score (standardised fusion; 0: off).
    time_boost: float = 1.0
    # Each candidate gains this much of the best fused score among the candidates of its
    # session (standardised fusion; 0: off).
    session_weight: float = 0.1
    duplicate_threshold: float = 0.9
    feedback: Feedback = field(default_factory=Feedback)
    # Terms of neighbouring turns count this much in a turn's lexical document.
    context_weight: float = 0.5
    neighbours: NeighbourConfig = field(default_factory=NeighbourConfig)
    # Open scopes kept per process: the least recently used beyond this are closed.
    max_open_users: int = 1000


@dataclass(frozen=True, slots=True)
class TurnVectors:
    """A turn's vectors: the first embedder's and, where the memory has a second dense
    list, the second's (None: embedded when the turn is indexed)."""

    first: np.ndarray
    second: np.ndarray | None = None


# A list's exact score of any candidate (ids it cannot score left out).
_Scorer = Callable[[Collection[int]], Awaitable[Mapping[int, float]]]


@dataclass(frozen=True, slots=True)
class _Side:
    """One list of a search: its name ("dense", "second", "lexical"), its ranking, its
    weight of a memory in English and of one mostly in CJK script, and its exact score
    of any candidate."""

    name: str
    ranking: list[ScoredId]
    weight: float
    weight_cjk: float
    exact: _Scorer


def _kept(scorer: _Scorer) -> _Scorer:
    """`scorer`, each id's score computed once: the fusion scores every candidate, and
    the trace asks again for those the turn reports."""
    known: dict[int, float] = {}
    unscored: set[int] = set()

    async def scores(ids: Collection[int]) -> Mapping[int, float]:
        if missing := [i for i in ids if i not in known and i not in unscored]:
            found = await scorer(missing)
            known.update(found)
            unscored.update(i for i in missing if i not in found)
        return {i: known[i] for i in ids if i in known}

    return scores


def _lexical_scorer(lexical: LexicalScores) -> _Scorer:
    async def scores(ids: Collection[int]) -> Mapping[int, float]:
        return lexical.of(ids)

    return scores


def _keep_trace(trace: SearchTrace, sides: Sequence[_Side], ranked: Sequence[ScoredId]) -> None:
    """Fill a search's trace: its fused ranking, and a scorer of each list's exact score
    (the vectors' inner products, the lexical side's BM25 of the weighted query its
    ranking came from), as the fusion weighs them."""

    async def scores(ids: Collection[int]) -> dict[str, Mapping[int, float]]:
        return {side.name: await side.exact(ids) for side in sides}

    trace.ranked = list(ranked)
    trace.scorer = scores


def _stored(turns: Sequence[Turn], matrix: np.ndarray) -> list[StoredVector]:
    return [
        StoredVector(t.id, t.user_pk, np.asarray(v, dtype=np.float32).tobytes())
        for t, v in zip(turns, matrix, strict=True)
    ]


# The most turns a time named in a query brings into the candidates (the newest).
MAX_SAID_IN_SPAN = 500


def raised(ranked: Sequence[ScoredId], ids: Collection[int], boost: float) -> list[ScoredId]:
    """`ranked` with the hits in `ids` raised by `boost`, ordered again (ties in the
    order they had)."""
    moved = [ScoredId(h.id, h.score + boost) if h.id in ids else h for h in ranked]
    return sorted(moved, key=lambda hit: -hit.score)


def with_session_prior(
    ranked: Sequence[ScoredId], session_of: Mapping[int, str], weight: float
) -> list[ScoredId]:
    """`ranked` with each hit raised by `weight` x the best score among the hits of its
    session, ordered again (ties in the order they had): the conversation a question is
    about is found by its best turn, and lifts the rest of it. A hit of no known session
    (the service reads those of its best `num_candidates`) is a session of its own."""
    sessions = [session_of.get(hit.id, f"#{hit.id}") for hit in ranked]
    best: dict[str, float] = {}
    for hit, session in zip(ranked, sessions, strict=True):
        best.setdefault(session, hit.score)
    moved = [
        ScoredId(h.id, h.score + weight * best[session])
        for h, session in zip(ranked, sessions, strict=True)
    ]
    return sorted(moved, key=lambda hit: -hit.score)


def searched_text(query: str) -> str:
    """What a query is searched with: the question a chatty message ends on after a
    topic-shift marker (retrieval/search/focus.py), else the whole query."""
    return focus_of(query) or query


def in_session_order(turns: Sequence[Turn], earlier: Sequence[Turn] = ()) -> list[Turn]:
    """`turns` with the `earlier` turns their indexed texts need, each session in order."""
    ids = {t.id for t in turns}
    merged = [*turns, *(t for t in earlier if t.id not in ids)]
    return sorted(merged, key=lambda t: (t.session_id, t.seq))


class TurnMemory:
    def __init__(
        self,
        messages: MessageRepository,
        embeddings: EmbeddingRepository,
        embedder: Embedder,
        index: VectorIndex,
        config: RetrievalConfig | None = None,
        *,
        snapshot_dir: Path | None = None,
        second: SecondDense | None = None,
    ) -> None:
        self._messages = messages
        # Where each user's lexical index and vocabulary are saved (None: never; they are
        # then built from SQL whenever a user's memory is opened).
        self._snapshot_dir = snapshot_dir
        # Open scopes whose texts changed since their snapshot was written, and how many
        # vocabulary words each snapshot holds embedded.
        self._unsaved: set[int] = set()
        self._saved_words: dict[int, int] = {}
        self._embeddings = embeddings
        self._embedder = embedder
        self._index = index
        self._config = config or RetrievalConfig()
        self._second = (
            SecondList(second, self._config.second_text, embeddings) if second is not None else None
        )
        self._lexical = self._new_lexical()
        self._neighbours = WordNeighbours(self._config.neighbours)
        # The first embedder's vectors of queries' pieces (retrieval/search/pieces.py).
        self._queries = QueryVectors()
        self._texts_loaded: set[int] = set()
        self._scope_locks: dict[int, asyncio.Lock] = {}
        # Each open scope's `memory_version`: the user's change count it is caught up to.
        self._versions: dict[int, int] = {}
        # Open scopes, least recently used first.
        self._recent: OrderedDict[int, None] = OrderedDict()
        # Each open scope's turns' sessions as far as known (a turn never changes session):
        # the session prior reads SQL for the others only.
        self._session_of: dict[int, dict[int, str]] = {}

    def _new_lexical(self) -> LexicalIndex:
        return LexicalIndex(
            feedback=self._config.feedback, context_weight=self._config.context_weight
        )

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    @property
    def vector_model(self) -> str:
        """The name stored with each vector: the model, and the text recipe unless raw."""
        return self._config.dense_text.stored_name(self._embedder.model_name)

    @property
    def second_model(self) -> str | None:
        """The name stored with each vector of the second dense list (None: it has none)."""
        return None if self._second is None else self._second.model

    @property
    def second_embedder(self) -> Embedder | None:
        return None if self._second is None else self._second.embedder

    @property
    def _needs_texts(self) -> bool:
        return self._config.mode != "dense" or self._config.duplicate_threshold <= 1

    @property
    def context_depth(self) -> int:
        """How many earlier turns of its session a turn's indexed texts need."""
        config = self._config
        return max(
            config.dense_text.previous, config.lexical_text.previous, config.second_text.previous
        )

    async def check_model(self) -> None:
        """Refuse to mix vectors of different models or texts: the fix is a full reindex.
        The first list's vectors must be there (unless nothing is stored); vectors of
        another model are those of a second list (completed in the background where it
        is configured, unused where it is not)."""
        wanted = {self.vector_model: self._embedder.dimension}
        if self._second is not None:
            wanted[self._second.model] = self._second.embedder.dimension
        configured = " and ".join(f"{model!r} (dimension {dim})" for model, dim in wanted.items())
        stored = await self._embeddings.list_embedding_models()
        wrong = [(m, d) for m, d in stored if m in wanted and d != wanted[m]]
        if stored and self.vector_model not in {m for m, _ in stored}:
            wrong += [(m, d) for m, d in stored if m not in wanted]
        if wrong:
            made = " and ".join(f"{m!r} (dimension {d})" for m, d in sorted(wrong))
            raise EmbeddingModelMismatchError(
                f"stored vectors were made by {made} but the configured embedders and turn "
                f"texts give {configured}; run `memchat reindex` to re-embed every stored "
                "turn, or configure the embedders that made them (MEMCHAT_EMBEDDER__*, "
                "MEMCHAT_SECOND_EMBEDDER__*)"
            )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of stored texts: turns, facts."""
        return await self._embedder.embed(list(texts))

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of search queries, for turns, facts and knowledge alike: the embedder's
        own query vectors where its model tells queries apart (`QueryEmbedder`)."""
        return await embed_queries(self._embedder, texts)

    async def embed_query(self, user_pk: int, query: str) -> np.ndarray:
        """A search query's vector, with the vectors of the query's words that the user's
        search would otherwise embed (related words) made in the same call, so that the
        search itself embeds nothing."""
        query = searched_text(query)
        words = self._words_to_embed(user_pk, query)
        pieces = self._queries.missing(self._pieces_of(query))
        if isinstance(self._embedder, QueryEmbedder):
            await self._embed_second_query(query)
            vectors = await self.embed_queries([query, *pieces])
            self._queries.put(pieces, vectors[1:])
            if words:
                self._neighbours.give_vectors(user_pk, words, await self.embed(words))
            return vectors[0]
        vectors = await self.embed([query, *pieces, *words])
        await self._embed_second_query(query)
        self._queries.put(pieces, vectors[1 : 1 + len(pieces)])
        self._neighbours.give_vectors(user_pk, words, vectors[1 + len(pieces) :])
        return vectors[0]

    async def embed_turn(
        self, query: str | None, turn: Turn, earlier: Sequence[Turn]
    ) -> tuple[np.ndarray | None, TurnVectors]:
        """The query's vector (None without a query) and the vectors `turn` will be indexed
        with (its dense pieces, `earlier` their context); in one call of the embedder
        (with the query's words, as `embed_query`) unless it embeds queries its own way.
        The second embedder, where there is one, makes the turn's second vector and the
        query's (kept for the search that follows: `SecondList.query_vector`)."""
        ordered = in_session_order([turn], earlier)
        position = [t.id for t in ordered].index(turn.id)
        own = dense_texts(self._config.dense_text, ordered)[position]
        # The models one after the other: run at once, their threads only contend for the
        # cores (bench/RESULTS.md).
        second = None
        if self._second is not None:
            second = (await self._second.embed_turns([turn], ordered))[0]
        if query is None or isinstance(self._embedder, QueryEmbedder):
            asked = None if query is None else await self.embed_query(turn.user_pk, query)
            first = mean_of_pieces(await self.embed(own), [len(own)])[0]
            return asked, TurnVectors(first, second)
        query = searched_text(query)
        words = self._words_to_embed(turn.user_pk, query)
        pieces = self._queries.missing(self._pieces_of(query))
        vectors = await self.embed([query, *pieces, *words, *own])
        await self._embed_second_query(query)
        num_asked = 1 + len(pieces) + len(words)
        self._queries.put(pieces, vectors[1 : 1 + len(pieces)])
        self._neighbours.give_vectors(turn.user_pk, words, vectors[1 + len(pieces) : num_asked])
        first = mean_of_pieces(vectors[num_asked:], [len(own)])[0]
        return vectors[0], TurnVectors(first, second)

    def _words_to_embed(self, user_pk: int, query: str) -> list[str]:
        """The query's words that its search would embed (`WordNeighbours.words_to_embed`)
        less those whose vectors the embedder's vocabulary holds, which are handed over
        now."""
        words = self._neighbours.words_to_embed(user_pk, query)
        if known := self._vocabulary_vectors(words):
            self._neighbours.give_vectors(user_pk, list(known), np.stack(list(known.values())))
        return [word for word in words if word not in known]

    async def _embed_words(self, words: Sequence[str]) -> np.ndarray:
        """Vectors of single words (query expansion's): from the embedder's vocabulary
        where it holds them, by the model otherwise, as `embed` makes them either way."""
        if not words:
            return await self.embed([])
        known = self._vocabulary_vectors(words)
        if missing := [word for word in words if word not in known]:
            known.update(zip(missing, await self.embed(missing), strict=True))
        return np.stack([known[word] for word in words])

    def _vocabulary_vectors(self, words: Sequence[str]) -> dict[str, np.ndarray]:
        """The words whose vectors the embedder reads from its vocabulary (`VocabularyEmbedder`),
        with them; none for another embedder."""
        if not words or not isinstance(self._embedder, VocabularyEmbedder):
            return {}
        return self._embedder.vocabulary_vectors(words)

    async def dense_query(self, query: str, vector: np.ndarray) -> DenseQuery:
        """A query as the dense lists of facts and knowledge search it: `vector` (its
        first vector, from `embed_query`), the second list's vector (kept by
        `embed_query`, or made now) and its script."""
        query = searched_text(query)
        second = None if self._second is None else await self._second.query_vector(query)
        return DenseQuery(vector, second, is_mostly_cjk(query))

    async def _embed_second_query(self, query: str) -> None:
        """The second embedder's vectors of a (searched) query and its pieces, kept for
        the search that follows."""
        if self._second is not None:
            await self._second.embed_query(query, self._pieces_of(query))

    async def num_vectors(self) -> int:
        """Vectors in the open scopes of the turn index."""
        return await self._index.num_vectors()

    async def ping_index(self) -> None:
        """Reach the turn index's store; raises IndexUnavailableError."""
        await self._index.ping()

    async def ensure_scope(self, user_pk: int, version: int | None = None) -> None:
        """Open the user's scope (from SQL, or the index's own file reconciled with SQL);
        with `version`, the user's change count as the caller read it from SQL, also
        catch an open scope up with what other processes stored or deleted since."""
        if self._is_open(user_pk) and (version is None or self._is_current(user_pk, version)):
            self._recent.move_to_end(user_pk)
            return
        lock = self._scope_locks.setdefault(user_pk, asyncio.Lock())
        async with lock:
            if not self._is_open(user_pk):
                # Read before loading: a change made meanwhile is caught up next time.
                seen = await self._embeddings.get_memory_version(user_pk)
                if not self._index.is_loaded(user_pk):
                    await self._reconcile_vectors(user_pk)
                if not self._texts_ready(user_pk):
                    await self._load_texts(user_pk)
                self._versions[user_pk] = seen
            elif version is not None and not self._is_current(user_pk, version):
                await self._catch_up(user_pk)
                self._versions[user_pk] = version
            self._recent[user_pk] = None
            self._recent.move_to_end(user_pk)
        await self._close_idle(keep=user_pk)

    async def _close_idle(self, keep: int) -> None:
        """Close the least recently used scopes beyond `max_open_users`; one in use (its
        lock held: opening, catching up, being written) is left for later."""
        for user_pk in list(self._recent):
            if len(self._recent) <= self._config.max_open_users:
                return
            lock = self._scope_locks.setdefault(user_pk, asyncio.Lock())
            if user_pk == keep or lock.locked():
                continue
            async with lock:  # free: taken at once, without yielding
                await self._close_scope(user_pk)

    async def _close_scope(self, user_pk: int) -> None:
        """This process's state of one user gone from memory; the vectors stay in SQL
        and in the index's storage, the next use reopens them."""
        await self._index.unload(user_pk)
        if self._second is not None:
            await self._second.index.unload(user_pk)
            self._second.forget_user(user_pk)
        self._lexical.drop(user_pk)
        self._neighbours.drop(user_pk)
        self._texts_loaded.discard(user_pk)
        self._session_of.pop(user_pk, None)
        self._versions.pop(user_pk, None)
        self._recent.pop(user_pk, None)
        log.debug("index_scope_closed", scope=user_pk)

    @property
    def num_open_users(self) -> int:
        return len(self._recent)

    def _is_open(self, user_pk: int) -> bool:
        return self._index.is_loaded(user_pk) and self._texts_ready(user_pk)

    def _is_current(self, user_pk: int, version: int) -> bool:
        return self._versions.get(user_pk, -1) >= version

    async def _catch_up(self, user_pk: int) -> None:
        """Add the turns SQL has and the scope lacks, drop those SQL no longer has (another
        process stored or deleted them): their vectors come from SQL, not the embedder.
        The vector index and the lexical one are compared with SQL each on its own: a
        shared vector store (the Chroma server) already holds what another process added,
        this process's lexical index does not."""
        sql_ids = await self._embeddings.list_user_vector_ids(user_pk, self.vector_model)
        have = await self._index.list_ids(user_pk)
        missing, extra = sql_ids - have, have - sql_ids
        await self._index.remove(user_pk, extra)
        self._forget_sessions(user_pk, extra)
        if missing:
            await add_stored(
                self._index,
                user_pk,
                await self._embeddings.list_user_vectors(user_pk, self.vector_model, missing),
            )
        if self._second is not None:
            await self._second.catch_up(user_pk, sql_ids)
        num_texts = 0
        if self._needs_texts:
            texts_have = self._lexical.list_ids(user_pk)
            self._remove_texts(user_pk, texts_have - sql_ids)
            self._unsaved.add(user_pk)
            if new := sql_ids - texts_have:
                turns = await self._messages.list_messages_by_id(user_pk, new)
                ordered = in_session_order(turns, await self._earlier(turns))
                self._add_texts(user_pk, turns, ordered)
                num_texts = len(turns)
        log.info(
            "index_scope_caught_up",
            scope=user_pk,
            num_added=len(missing),
            num_removed=len(extra),
            num_texts_added=num_texts,
        )

    def _texts_ready(self, user_pk: int) -> bool:
        return not self._needs_texts or user_pk in self._texts_loaded

    async def _reconcile_vectors(self, user_pk: int) -> None:
        async def add(missing: set[int]) -> None:
            stored = await self._embeddings.list_user_vectors(user_pk, self.vector_model, missing)
            await add_stored(self._index, user_pk, stored)

        sql_ids = await self._embeddings.list_user_vector_ids(user_pk, self.vector_model)
        await reconcile(self._index, user_pk, sql_ids, add, event="index_scope_reconciled")
        if self._second is not None:
            await self._second.open(user_pk, sql_ids)

    async def _load_texts(self, user_pk: int) -> None:
        """Open the user's lexical index and vocabulary: from their snapshot, caught up
        with SQL, else built from every stored turn."""
        if not await self._restore_texts(user_pk):
            turns = await self._messages.list_user_messages(user_pk)
            self._lexical.reset(user_pk)
            self._neighbours.drop(user_pk)
            self._add_texts(user_pk, turns, turns)
        self._texts_loaded.add(user_pk)

    def _snapshot_paths(self, user_pk: int) -> tuple[Path, Path]:
        assert self._snapshot_dir is not None
        stem = self._snapshot_dir / f"scope-{user_pk}"
        return stem.with_suffix(".bm25"), stem.with_suffix(".words")

    async def _restore_texts(self, user_pk: int) -> bool:
        """The user's snapshot taken, then the turns SQL has and it lacks added and those
        SQL no longer has removed (turns are never edited, only added and deleted);
        False if there is no intact snapshot of this recipe and embedder."""
        if self._snapshot_dir is None:
            return False
        lexical_path, words_path = self._snapshot_paths(user_pk)
        lexical_data, words = await anyio.to_thread.run_sync(
            _read_snapshots, lexical_path, words_path, self._snapshot_tag
        )
        if lexical_data is None or words is None:
            return False
        if not await anyio.to_thread.run_sync(self._lexical.restore, user_pk, lexical_data):
            return False
        self._neighbours.restore(user_pk, words)
        self._know_sessions(user_pk, (await self._messages.sessions_of_user(user_pk)).items())
        sql_ids = await self._embeddings.list_user_vector_ids(user_pk, self.vector_model)
        have = self._lexical.list_ids(user_pk)
        self._remove_texts(user_pk, have - sql_ids)
        if new := sql_ids - have:
            turns = await self._messages.list_messages_by_id(user_pk, new)
            self._add_texts(user_pk, turns, in_session_order(turns, await self._earlier(turns)))
        self._saved_words[user_pk] = self._neighbours.num_embedded(user_pk)
        if new or have - sql_ids:
            self._unsaved.add(user_pk)
        log.info(
            "lexical_scope_restored",
            scope=user_pk,
            num_turns=len(sql_ids),
            num_added=len(new),
            num_removed=len(have - sql_ids),
        )
        return True

    @property
    def _snapshot_tag(self) -> str:
        """What a snapshot must have been made with: the lexical recipe, the context
        weight and the vocabulary's embedder."""
        recipe = self._config.lexical_text.tag()
        return f"{recipe}|{self._config.context_weight}|{self._embedder.model_name}"

    async def _save_snapshots(self) -> None:
        """Write the snapshot of every open scope whose texts or embedded vocabulary
        changed since its last one."""
        if self._snapshot_dir is None or not self._needs_texts:
            return
        for user_pk in list(self._recent):
            words = self._neighbours.num_embedded(user_pk)
            if user_pk not in self._unsaved and self._saved_words.get(user_pk) == words:
                continue
            lexical = self._lexical.snapshot(user_pk)
            vocabulary = self._neighbours.snapshot(user_pk)
            if lexical is None or vocabulary is None:
                continue
            lexical_path, words_path = self._snapshot_paths(user_pk)
            await anyio.to_thread.run_sync(
                _write_snapshots, lexical_path, lexical, words_path, vocabulary, self._snapshot_tag
            )
            self._unsaved.discard(user_pk)
            self._saved_words[user_pk] = words

    def _add_texts(self, user_pk: int, turns: Sequence[Turn], ordered: list[Turn]) -> None:
        """Index `turns`; `ordered` is them with their context, in session order."""
        wanted = {t.id for t in turns}
        parts = indexed_parts(self._config.lexical_text, ordered)
        chosen = [
            (t.id, own, context)
            for t, (own, context) in zip(ordered, parts, strict=True)
            if t.id in wanted
        ]
        self._unsaved.add(user_pk)
        self._know_sessions(user_pk, ((t.id, t.session_id) for t in turns))
        contents = {t.id: t.content for t in turns}
        self._lexical.add(
            user_pk,
            [c[0] for c in chosen],
            [c[1] for c in chosen],
            [c[2] for c in chosen],
            own=[contents[c[0]] for c in chosen],
        )
        if self._config.neighbours.is_enabled:
            self._neighbours.add(user_pk, [f"{t.content} {t.image_caption or ''}" for t in turns])

    async def _embed_turns(self, turns: Sequence[Turn], ordered: list[Turn]) -> np.ndarray:
        """One vector per turn: the normalised mean of its dense pieces' vectors."""
        return await embed_turns(self.embed, self._config.dense_text, turns, ordered)

    async def index(
        self,
        turns: Sequence[Turn],
        *,
        vectors: Sequence[np.ndarray | TurnVectors] | None = None,
        earlier: Sequence[Turn] | None = None,
        fresh: bool = False,
    ) -> None:
        """Store the turns' vectors in SQL (every dense list's, in one transaction), then
        add the turns to the vector and lexical indexes. `vectors` are the turns' own
        (from `embed_turn`; a bare array is the first list's), else they are embedded
        here; `earlier` holds the turns before them that their texts need (else read from
        SQL); `fresh` turns were just stored and have no vector to replace."""
        if not turns:
            return
        if earlier is None:
            earlier = await self._earlier(turns)
        ordered = in_session_order(turns, earlier)
        given = [v if isinstance(v, TurnVectors) else TurnVectors(v) for v in vectors or ()]
        matrix = (
            np.asarray([v.first for v in given])
            if vectors is not None
            else await self._embed_turns(turns, ordered)
        )
        sets = [VectorSet(self.vector_model, self._embedder.dimension, _stored(turns, matrix))]
        second: list[StoredVector] = []
        if self._second is not None:
            if given and all(v.second is not None for v in given):
                second_matrix = np.asarray([v.second for v in given])
            else:
                second_matrix = await self._second.embed_turns(turns, ordered)
            second = _stored(turns, second_matrix)
            sets.append(VectorSet(self._second.model, self._second.embedder.dimension, second))
        versions = await self._embeddings.save_embeddings(sets, replace=not fresh)
        stored = sets[0].vectors
        for user_pk in sorted({t.user_pk for t in turns}):
            await self.ensure_scope(user_pk)
            await add_stored(self._index, user_pk, [s for s in stored if s.user_pk == user_pk])
            if self._second is not None:
                await add_stored(
                    self._second.index, user_pk, [s for s in second if s.user_pk == user_pk]
                )
            if self._needs_texts:
                self._add_texts(user_pk, [t for t in turns if t.user_pk == user_pk], ordered)
                # Their new words now, rather than in the user's next search.
                await self._neighbours.embed_pending(user_pk, self._embed_words)
            new = versions.get(user_pk)
            if new is not None and self._versions.get(user_pk) == new - 1:
                # Only this write happened since the scope was current: it still is.
                self._versions[user_pk] = new

    async def _earlier(self, turns: Sequence[Turn]) -> list[Turn]:
        """The turns before `turns` in their sessions that their indexed texts need."""
        depth = self.context_depth
        have = {(t.session_id, t.seq) for t in turns}
        wanted = {
            (t.session_id, t.seq - back)
            for t in turns
            for back in range(1, depth + 1)
            if t.seq - back > 0
        } - have
        return await self._messages.list_messages_by_seq(wanted) if wanted else []

    async def search(
        self,
        user_pk: int,
        vector: np.ndarray,
        k: int,
        exclude: Collection[int] = (),
        query: str | None = None,
        version: int | None = None,
        *,
        trace: SearchTrace | None = None,
        now: dt.datetime | None = None,
    ) -> list[ScoredId]:
        """The user's best k turns for a query, less `exclude`, best first.

        Without the query text only the vectors are searched; a chatty one is searched by
        the question it ends on (`searched_text`, as its vector was made). `version` is the user's
        change count as read with the user's row: the scope is caught up to it first, so
        every turn any process acknowledged (or deleted) is found (or not). A `trace` is
        filled with what the search weighed (`retrieval.search.trace`). A query that names
        a time (`retrieval.search.when`, against `now`: the moment it is asked by default)
        adds the turns said then to the candidates and raises them by `time_boost`.
        """
        await self.ensure_scope(user_pk, version)
        if query is not None:
            query = searched_text(query)
        config = self._config
        fetch = max(k, config.num_candidates)
        is_cjk = is_mostly_cjk(query or "")
        sides: list[_Side] = []
        pieces = self._pieces_of(query)
        if config.mode != "lexical" or query is None:
            weight = config.dense_weight_cjk if is_cjk else config.dense_weight
            # An English-only model's similarity to a Chinese memory is noise.
            on_cjk = weight if config.dense_weight_cjk > 0 else 0.0
            piece_vectors = await self._queries.of(pieces, self.embed_queries)
            with stage("index_search", index="dense", k=fetch) as searching:
                found, exact = await self._dense_list(
                    self._index, user_pk, vector, piece_vectors, fetch, exclude
                )
                searching.record(num_hits=len(found), num_pieces=len(pieces))
            sides.append(_Side("dense", found, weight, on_cjk, _kept(exact)))
            if self._second is not None and query is not None and self._second.is_ready(user_pk):
                with stage("index_search", index="second_dense", k=fetch) as searching:
                    second, second_pieces = await self._second.query_vectors(query, pieces)
                    found, exact = await self._dense_list(
                        self._second.index, user_pk, second, second_pieces, fetch, exclude
                    )
                    searching.record(num_hits=len(found), num_pieces=len(pieces))
                weight = config.second_weight_cjk if is_cjk else config.second_weight
                sides.append(_Side("second", found, weight, config.second_weight_cjk, _kept(exact)))
        if config.mode != "dense" and query is not None:
            with stage("index_search", index="lexical", k=fetch) as searching:
                terms = await self._query_terms(user_pk, query, exclude)
                lexical = self._lexical.score(user_pk, terms, fetch, exclude)
                top = lexical.top(fetch, exclude)
                searching.record(num_hits=len(top), num_terms=len(terms))
            weight = config.lexical_weight
            sides.append(_Side("lexical", top, weight, weight, _kept(_lexical_scorer(lexical))))
        said_then = await self._said_in_span(user_pk, query, now, exclude)
        ranked = await self._fuse(user_pk, sides, said_then)
        if said_then:
            ranked = raised(ranked, said_then, config.time_boost)
        if config.session_weight > 0 and config.fusion == "zscore" and len(sides) > 1:
            with stage("session_prior") as weighing:
                # The best `fetch` only: a candidate below them keeps its place.
                best_ids = [h.id for h in ranked[:fetch]]
                sessions = await self._sessions_of(user_pk, best_ids)
                weighing.record(num_sessions=len(set(sessions.values())))
            ranked = with_session_prior(ranked, sessions, config.session_weight)
        if trace is not None:
            _keep_trace(trace, sides, ranked)
        if config.duplicate_threshold > 1:
            return ranked[:k]
        return drop_near_duplicates(
            ranked,
            lambda message_id: self._lexical.fingerprint(user_pk, message_id),
            config.duplicate_threshold,
            k,
        )

    async def _sessions_of(self, user_pk: int, ids: Sequence[int]) -> dict[int, str]:
        """The session of each of the user's turns among `ids`, from SQL where not known."""
        known = self._session_of.setdefault(user_pk, {})
        if missing := [i for i in ids if i not in known]:
            self._know_sessions(
                user_pk, (await self._messages.sessions_of(user_pk, missing)).items()
            )
        return {i: known[i] for i in ids if i in known}

    def _know_sessions(self, user_pk: int, sessions: Iterable[tuple[int, str]]) -> None:
        """Record turns' sessions (id, session id) in the scope; session ids are shared by
        many turns, so each is held once."""
        known = self._session_of.setdefault(user_pk, {})
        known.update((i, sys.intern(session)) for i, session in sessions)

    def _forget_sessions(self, user_pk: int, message_ids: Collection[int]) -> None:
        known = self._session_of.get(user_pk, {})
        for message_id in message_ids:
            known.pop(message_id, None)

    async def _said_in_span(
        self, user_pk: int, query: str | None, now: dt.datetime | None, exclude: Collection[int]
    ) -> set[int]:
        """The user's turns said in the span the query names, the newest
        `MAX_SAID_IN_SPAN` of them (none without a span, or with no boost)."""
        if query is None or self._config.time_boost <= 0 or self._config.fusion != "zscore":
            return set()
        span = time_span(query, now or dt.datetime.now(dt.UTC))
        if span is None:
            return set()
        with stage("time_span") as finding:
            ids = await self._messages.list_ids_said_between(
                user_pk, span.start, span.end, MAX_SAID_IN_SPAN
            )
            finding.record(num_turns=len(ids))
        return set(ids) - set(exclude)

    def _pieces_of(self, query: str | None) -> list[str]:
        """The sentences a (searched) query is also searched by, if any."""
        if query is None or self._config.piece_weight <= 0:
            return []
        return query_pieces(query)

    async def _dense_list(
        self,
        index: VectorIndex,
        user_pk: int,
        vector: np.ndarray,
        pieces: np.ndarray,
        fetch: int,
        exclude: Collection[int],
    ) -> tuple[list[ScoredId], _Scorer]:
        """A dense list's hits and its exact scorer: by the query's vector, or where the
        query has pieces (their vectors, `pieces`) by the combined score of
        retrieval/search/pieces.py."""
        if not len(pieces):

            async def similarities(ids: Collection[int]) -> Mapping[int, float]:
                return await index.similarities(user_pk, vector, ids)

            return await index.search(user_pk, vector, fetch, exclude), similarities
        scorer = PieceScorer(index, user_pk, vector, pieces, self._config.piece_weight)
        return await scorer.search(fetch, exclude), scorer.scores

    async def _fuse(
        self, user_pk: int, sides: Sequence[_Side], extra: Collection[int] = ()
    ) -> list[ScoredId]:
        """The lists' rankings as one (a single list's as it is); `extra` ids are
        candidates too (standardised fusion only), scored by each list exactly."""
        if len(sides) == 1 and not extra:
            return sides[0].ranking
        method = self._config.fusion
        with stage("fusion", method=method, num_lists=len(sides)) as fusing:
            if method == "zscore":
                ranked = await self._standardised(user_pk, sides, extra)
            else:
                rankings = [side.ranking for side in sides]
                weights = [side.weight for side in sides]
                ranked = reciprocal_rank_fusion(rankings, weights, self._config.rrf_c)
            fusing.record(num_candidates=len(ranked))
        return ranked

    async def _standardised(
        self, user_pk: int, sides: Sequence[_Side], extra: Collection[int] = ()
    ) -> list[ScoredId]:
        """The lists fused by standardised scores, each candidate scored exactly by each
        (the lexical side from the scores its ranking came from), weighed by the
        language of the memory where a side's weight depends on it."""
        candidates = {hit.id for side in sides for hit in side.ranking} | set(extra)
        # A memory's language is read only where some side's weight depends on it (not
        # for a Chinese query, whose weights are those of a Chinese memory already).
        in_cjk: set[int] = set()
        if any(side.weight_cjk != side.weight for side in sides):
            in_cjk = {i for i in candidates if self._lexical.is_mostly_cjk(user_pk, i)}
        exact: list[Mapping[int, float]] = []
        weights: list[float | Mapping[int, float]] = []
        for side in sides:
            exact.append(await side.exact(candidates))
            if side.weight_cjk == side.weight or not in_cjk:
                weights.append(side.weight)
            else:
                weights.append(
                    {i: side.weight_cjk if i in in_cjk else side.weight for i in candidates}
                )
        return standardised_fusion([side.ranking for side in sides], exact, weights, extra)

    async def _query_terms(
        self, user_pk: int, query: str, exclude: Collection[int]
    ) -> dict[str, float]:
        """The weighted lexical terms of a query: its own, related words, feedback."""
        related = await self._neighbours.related(user_pk, query, self._embed_words)
        return self._lexical.query_weights(
            user_pk, query, related.weights, exclude, sources=related.sources
        )

    async def forget(self, user_pk: int, message_ids: Collection[int]) -> None:
        """Drop vectors and terms of messages already deleted from SQL, and write the
        files at once: no file of the data directory keeps their text (nor their
        vectors) until the next periodic save."""
        await self.ensure_scope(user_pk)
        async with self._scope_locks.setdefault(user_pk, asyncio.Lock()):
            await self._index.remove(user_pk, message_ids)
            if self._second is not None:
                await self._second.index.remove(user_pk, message_ids)
            self._remove_texts(user_pk, message_ids)
            self._unsaved.add(user_pk)
        await self.save()

    def _remove_texts(self, user_pk: int, message_ids: Collection[int]) -> None:
        """Turns out of the lexical index, and with them the terms and vocabulary words
        that only they held (so a snapshot written later holds none of their words)."""
        if not message_ids:
            return
        self._forget_sessions(user_pk, message_ids)
        self._lexical.remove(user_pk, message_ids)
        self._neighbours.keep_terms(user_pk, self._lexical.compact(user_pk))

    async def _drop_scope(self, user_pk: int) -> None:
        """Every derived state of one user gone, vectors and snapshots on disk included."""
        await self._index.drop(user_pk)
        if self._second is not None:
            await self._second.index.drop(user_pk)
            self._second.forget_user(user_pk)
        if self._snapshot_dir is not None:
            for path in self._snapshot_paths(user_pk):
                path.unlink(missing_ok=True)
        self._unsaved.discard(user_pk)
        self._saved_words.pop(user_pk, None)
        self._lexical.drop(user_pk)
        self._neighbours.drop(user_pk)
        self._texts_loaded.discard(user_pk)
        self._session_of.pop(user_pk, None)
        self._versions.pop(user_pk, None)
        self._recent.pop(user_pk, None)

    async def forget_user(self, user_pk: int, message_ids: Collection[int]) -> None:
        """Drop a user's whole scope after their rows are gone."""
        async with self._scope_locks.setdefault(user_pk, asyncio.Lock()):
            await self._drop_scope(user_pk)

    async def reindex_user(self, user_pk: int) -> int:
        """Re-embed one user's turns with the configured model and rebuild their scope."""
        async with self._scope_locks.setdefault(user_pk, asyncio.Lock()):
            await self._embeddings.delete_user_embeddings(user_pk)
            await self._drop_scope(user_pk)
        turns = await self._messages.list_user_messages(user_pk)
        for start in range(0, len(turns), REPAIR_BATCH_SIZE):
            batch = turns[start : start + REPAIR_BATCH_SIZE]
            await self.index(batch, earlier=turns, fresh=True)
        await self.ensure_scope(user_pk)
        await self._index.save()
        return len(turns)

    async def second_progress(self) -> tuple[int, int] | None:
        """(turns holding the second list's vector, turns holding the first's); None
        without a second list."""
        if self.second_model is None:
            return None
        counts = await self._embeddings.count_vectors()
        return counts.get(self.second_model, 0), counts.get(self.vector_model, 0)

    async def backfill_second(
        self,
        hold: Callable[[int], AbstractAsyncContextManager[bool]],
        on_progress: Callable[[int], object] | None = None,
    ) -> int:
        """Give the second list's vector to every turn that holds only the first's (a
        store indexed before the second list was added), user by user, a batch at a time,
        each batch stored at once: a process stopped midway resumes where it stopped.
        `hold(user_pk)` claims a user's turns (False: another process is embedding them,
        they are left to it), so that no turn is embedded twice. Returns how many turns
        this call embedded; `on_progress` is told each batch's size."""
        if self._second is None:
            return 0
        first, second = self.vector_model, self._second.model
        dimension = self._second.embedder.dimension
        num_embedded = 0
        for user_pk in await self._messages.list_users_lacking_second_vector(first, second):
            async with hold(user_pk) as is_held:
                if not is_held:
                    continue
                while batch := await self._messages.list_lacking_second_vector(
                    first, second, REPAIR_BATCH_SIZE, user_pk=user_pk
                ):
                    with stage("second_list_backfill", user_pk=user_pk, num_turns=len(batch)):
                        ordered = in_session_order(batch, await self._earlier(batch))
                        stored = _stored(batch, await self._second.embed_turns(batch, ordered))
                        versions = await self._embeddings.save_embeddings(
                            [VectorSet(second, dimension, stored)], replace=False
                        )
                        await self._took_second(user_pk, stored, versions.get(user_pk))
                    num_embedded += len(batch)
                    if on_progress is not None:
                        on_progress(len(batch))
        if num_embedded:
            log.info("second_vectors_backfilled", model=second, num_turns=num_embedded)
        return num_embedded

    async def _took_second(
        self, user_pk: int, stored: Sequence[StoredVector], version: int | None
    ) -> None:
        """An open scope given the second vectors just stored for it."""
        if self._second is None or not self._is_open(user_pk):
            return
        async with self._scope_locks.setdefault(user_pk, asyncio.Lock()):
            if not self._is_open(user_pk):
                return
            await self._second.took(user_pk, stored, await self._index.list_ids(user_pk))
            if version is not None and self._versions.get(user_pk) == version - 1:
                self._versions[user_pk] = version

    async def scope_sizes(self, user_pk: int) -> tuple[int, int]:
        """(vectors, lexical documents) of a user's loaded scope; (0, 0) if not loaded."""
        return len(await self._index.list_ids(user_pk)), len(self._lexical.list_ids(user_pk))

    async def repair_unembedded(self) -> int:
        """Embed and index messages that were stored without a vector (crash recovery).
        With several processes, some may be messages another process has just stored and
        is about to index: whichever vector is stored first is kept (`fresh`)."""
        num_repaired = 0
        while batch := await self._messages.list_unembedded_messages(
            REPAIR_BATCH_SIZE, self.vector_model
        ):
            await self.index(batch, fresh=True)
            num_repaired += len(batch)
        if num_repaired:
            log.info("unembedded_messages_repaired", num_messages=num_repaired)
        return num_repaired

    async def reindex_all(self, on_progress: Callable[[int], object] | None = None) -> int:
        """Re-embed every stored message with the configured model and rebuild the index;
        `on_progress` is told the number of messages of each batch done."""
        await self._embeddings.delete_all_embeddings()
        await self._index.drop_all()
        if self._second is not None:
            await self._second.index.drop_all()
            self._second.forget_all()
        self._lexical = self._new_lexical()
        self._neighbours = WordNeighbours(self._config.neighbours)
        self._texts_loaded.clear()
        self._session_of.clear()
        self._versions.clear()
        self._recent.clear()
        self._unsaved.clear()
        self._saved_words.clear()
        if self._snapshot_dir is not None:
            for path in self._snapshot_dir.glob("scope-*"):
                path.unlink()
        num_messages = 0
        after_id = 0
        while batch := await self._messages.list_messages_after_id(after_id, REPAIR_BATCH_SIZE):
            await self.index(batch, fresh=True)
            num_messages += len(batch)
            if on_progress is not None:
                on_progress(len(batch))
            after_id = batch[-1].id
        await self.save()
        return num_messages

    async def save(self) -> None:
        await self._index.save()
        if self._second is not None:
            await self._second.index.save()
        await self._save_snapshots()

    async def wait_built(self) -> None:
        """Wait for the vector index's background work (the approximate index of a large
        scope, built off the event loop), where it does any."""
        for index in (self._index, self._second.index if self._second else None):
            wait = getattr(index, "wait_built", None)
            if wait is not None:
                await wait()
