"""The knowledge base: documents chunked and embedded, chunks in SQL, vectors in an index.

SQL is the source of truth: a document's text and its chunks are stored before their
vectors are added, so the index (Chroma by default) can always be rebuilt from SQL. Index
scopes (`storage.knowledge.scope_of`): minus a tenant's id holds the knowledge shared by
that tenant's users, a user's pk (>= 1) that user's own documents; a search for a user
reads their tenant's shared scope and their own, and nothing else. Like the turn index,
a scope is reconciled with SQL when this process first uses it (missing chunks
re-embedded, stray vectors removed), so a lost Chroma directory heals itself; `rebuild`
redoes every scope.

A document is `processing` until all its chunks are stored and indexed, then `ready`, or
`failed` with a reason. Small documents are processed before the upload is answered;
larger ones in the background, a batch of chunks at a time (`num_chunks_indexed` shows
the progress). Documents still `processing` at start (the process stopped) are resumed,
and so, every sweep interval, are those that no process is working on (one was killed).

Several API processes on one PostgreSQL database process each document once: whoever
processes a document (the upload, a resume, a failed document uploaded again) claims it
first (`storage.claims`, a lock held on a connection of its own for the whole
processing), then checks that it is still in the state it was found in; a document
claimed by another process is left to that one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from retrieval.dense import DenseQuery, SecondDense
from retrieval.errors import DocumentTooLargeError, InvalidInputError, RetrievalError
from retrieval.fusion import LanguageWeights, fuse_by_language
from retrieval.indexes.reconcile import reconcile
from retrieval.knowledge.chunking import Chunk, Chunker
from retrieval.protocols import Embedder, ScoredId, VectorIndex
from retrieval.sweeps import sweep_every
from retrieval.text import is_blank, is_mostly_cjk
from storage.claims import KNOWLEDGE_PROCESSING, JobClaimRepository, document_key
from storage.errors import NotFoundError, StorageError
from storage.knowledge import (
    FAILED,
    PROCESSING,
    READY,
    KnowledgeRepository,
    NewChunk,
    NewDocument,
    StoredChunk,
    scope_of,
)
from storage.records import Document

log = structlog.get_logger(__name__)

MARKDOWN_SOURCES = frozenset({"text", "md"})


@dataclass(frozen=True, slots=True)
class KnowledgeConfig:
    chunk_tokens: int = 160
    overlap_tokens: int = 32
    # With two dense lists, each list's best this many chunks are fused.
    num_candidates: int = 20
    embed_batch_size: int = 64
    max_document_chars: int = 2_000_000
    # Documents of at most this many chunks are ready when the upload is answered.
    inline_chunks: int = 64
    max_upload_bytes: int = 16 * 1024 * 1024
    # How often documents left `processing` by another process are resumed (0: only at start).
    sweep_interval_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Upload:
    tenant_id: int
    user_id: str | None
    title: str
    text: str
    metadata: dict[str, Any]
    source: str
    filename: str | None = None


@dataclass(frozen=True, slots=True)
class KnowledgeHit:
    chunk: StoredChunk
    score: float


# Blank as the API documents it (JSON Schema's `\s`), so that documented-valid text is taken.
BLANK = (
    "\t\n\v\f\r \u00a0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000\ufeff")
)


def normalise(text: str) -> str:
    """Line endings unified and outer blank space dropped: the form that is stored and hashed."""
    return text.replace("\r\n", "\n").replace("\r", "\n").strip(BLANK)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(frozen=True, slots=True)
class _DenseList:
    """One dense list of chunks: its embedder, its index and its fusion weights."""

    embedder: Embedder
    index: VectorIndex
    weights: LanguageWeights


def embedding_text(chunk: StoredChunk | Chunk, title: str) -> str:
    """What is embedded: the chunk with its title and heading path, which carry its topic."""
    return "\n".join(part for part in (title, chunk.heading_path, chunk.text) if part)


class KnowledgeBase:
    def __init__(
        self,
        store: KnowledgeRepository,
        embedder: Embedder,
        index: VectorIndex,
        config: KnowledgeConfig,
        *,
        claims: JobClaimRepository | None = None,
        second: SecondDense | None = None,
        weights: tuple[LanguageWeights, LanguageWeights] = (
            LanguageWeights(1.0, 1.0),
            LanguageWeights(1.0, 1.0),
        ),
    ) -> None:
        """`claims`: the database's claims where other processes share it (PostgreSQL);
        None where this process is alone (SQLite). `second`: a second model's list of
        the chunks (every chunk embedded by both, each into its own index), fused with
        the first by `weights` (the first list's, the second's) as the turns' lists are."""
        self._store = store
        self._lists = [_DenseList(embedder, index, weights[0])]
        if second is not None:
            self._lists.append(_DenseList(second.embedder, second.index, weights[1]))
        self._config = config
        self._claims = claims
        self._chunker = Chunker(config.chunk_tokens, config.overlap_tokens)
        self._scope_locks: dict[int, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._held: set[str] = set()  # documents this process is processing
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def max_upload_bytes(self) -> int:
        return self._config.max_upload_bytes

    # Documents ------------------------------------------------------------------------

    async def add(self, upload: Upload) -> tuple[Document, str | None, bool]:
        """Store a document (or find the same content in the same scope) and process it.

        Returns (document, owner's user id, created). A document whose processing failed
        before is processed again; one being processed is left to finish.
        """
        text = normalise(upload.text)
        if is_blank(text):
            raise InvalidInputError("text", "the document has no text")
        if len(text) > self._config.max_document_chars:
            raise DocumentTooLargeError(
                "text",
                f"the document has {len(text)} characters; the limit is "
                f"{self._config.max_document_chars}",
            )
        document, owner, created = await self._store.add_document(
            NewDocument(
                tenant_id=upload.tenant_id,
                user_external_id=upload.user_id,
                title=upload.title,
                metadata=upload.metadata,
                source=upload.source,
                filename=upload.filename,
                content=text,
                content_hash=content_hash(text),
            )
        )
        if created or (document.status == FAILED and document.id not in self._tasks):
            chunks = self._split(document)
            if len(chunks) > self._config.inline_chunks:
                # The answer shows the state before any batch: `processing`, 0 indexed.
                started = asyncio.get_running_loop().create_future()
                self._spawn(document.id, document.status, started)
                await started
            else:
                async with self._claim(document.id, document.status) as is_claimed:
                    if is_claimed:
                        await self._process(document, chunks)
        document, owner = await self._store.get_document(document.id)
        return document, owner, created

    def _split(self, document: Document) -> list[Chunk]:
        return self._chunker.split(document.content, markdown=document.source in MARKDOWN_SOURCES)

    @contextlib.asynccontextmanager
    async def _claim(self, document_id: str, status: str) -> AsyncIterator[bool]:
        """Whether this process may process the document, claimed for the body: no other
        task of this process nor another process holds it, and it is still in `status`
        (the state it was found in: another process may have just finished it)."""
        if document_id in self._held:
            yield False
            return
        self._held.add(document_id)
        try:
            if self._claims is None:
                yield await self._is_in_status(document_id, status)
                return
            key = document_key(document_id)
            async with self._claims.try_hold(KNOWLEDGE_PROCESSING, key) as is_held:
                yield is_held and await self._is_in_status(document_id, status)
        finally:
            self._held.discard(document_id)

    async def _is_in_status(self, document_id: str, status: str) -> bool:
        document, _owner = await self._store.get_document(document_id)
        return document.status == status

    def _spawn(
        self,
        document_id: str,
        status: str = PROCESSING,
        started: asyncio.Future[None] | None = None,
    ) -> None:
        task = asyncio.create_task(self._process_in_background(document_id, status, started))
        self._tasks[document_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(document_id, None))
        if started is not None:
            # However the task ends (even cancelled before it ran), the upload answers.
            task.add_done_callback(lambda _t: _resolve(started))

    async def _process_in_background(
        self, document_id: str, status: str, started: asyncio.Future[None] | None
    ) -> None:
        """Process a document found in `status`; `started` (an upload waiting to answer)
        is told once the document shows its planned chunks, or once it is left alone."""
        try:
            async with self._claim(document_id, status) as is_claimed:
                if not is_claimed:
                    return  # another process has it, or had it done
                document, _owner = await self._store.get_document(document_id)
                chunks = await asyncio.to_thread(self._split, document)
                if started is not None:
                    await self._store.start_processing(document.id, len(chunks))
                    _resolve(started)
                await self._process(document, chunks)
        except NotFoundError:
            return  # deleted meanwhile
        except (RetrievalError, StorageError):
            return  # recorded as the document's failure by _process, or found again by a sweep
        except Exception:  # the boundary of a background task: record, never hang
            log.exception("knowledge_processing_crashed", document_id=document_id)
            await self._store.finish_document(document_id, FAILED, "internal error")

    async def _process(self, document: Document, chunks: Sequence[Chunk]) -> None:
        """Chunks to SQL and their vectors to the index, a batch at a time, then `ready`.

        A failure marks the document `failed` with the reason and is raised again.
        """
        if not chunks:
            await self._store.finish_document(
                document.id, FAILED, "the document has no text besides headings"
            )
            return
        scope = scope_of(document.tenant_id, document.user_pk)
        try:
            await self._ensure_scope(scope)
            stale = await self._store.start_processing(document.id, len(chunks))
            for dense in self._lists:
                await dense.index.remove(scope, stale)
            batch_size = self._config.embed_batch_size
            for start in range(0, len(chunks), batch_size):
                batch = chunks[start : start + batch_size]
                texts = [embedding_text(c, document.title) for c in batch]
                matrices = [await dense.embedder.embed(texts) for dense in self._lists]
                ids = await self._store.add_chunks(
                    document.id,
                    [NewChunk(c.ordinal, c.text, c.token_count, c.heading_path) for c in batch],
                )
                for dense, vectors in zip(self._lists, matrices, strict=True):
                    await dense.index.add(scope, ids, vectors)
            await self._store.finish_document(document.id, READY, None)
        except NotFoundError:
            raise
        except (RetrievalError, StorageError) as exc:
            log.warning("knowledge_processing_failed", document_id=document.id, error=str(exc))
            await self._store.finish_document(document.id, FAILED, str(exc))
            raise

    async def start(self) -> None:
        """Resume the documents left `processing`, now and every sweep interval."""
        await self.resume_unfinished()
        if self._config.sweep_interval_s > 0:
            sweeper = sweep_every(
                self._config.sweep_interval_s,
                self.resume_unfinished,
                event="knowledge_sweep_failed",
            )
            self._sweeper = asyncio.create_task(sweeper, name="knowledge-sweep")

    async def resume_unfinished(self) -> int:
        """Process again, in the background, documents left `processing` by a process that
        stopped; those another process is processing are left to it (its claim)."""
        ids = await self._store.list_document_ids_in_status(PROCESSING)
        for document_id in ids:
            if document_id not in self._tasks and document_id not in self._held:
                self._spawn(document_id)
        return len(ids)

    async def wait_idle(self) -> None:
        """Wait for background processing to finish (tests, benchmarks, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def delete(self, document_id: str) -> None:
        """Remove a document's rows, then its vectors (a stray vector is never shown)."""
        task = self._tasks.get(document_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        scope, chunk_ids = await self._store.delete_document(document_id)
        if chunk_ids:
            await self._ensure_scope(scope)
            for dense in self._lists:
                await dense.index.remove(scope, chunk_ids)

    async def close(self) -> None:
        """Stop background work; unfinished documents stay `processing` and are resumed at
        the next start, or by another process's sweep."""
        tasks = list(self._tasks.values())
        if self._sweeper is not None:
            tasks.append(self._sweeper)
            self._sweeper = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._claims is not None:
            await self._claims.dispose()

    # Retrieval ------------------------------------------------------------------------

    async def num_vectors(self) -> int:
        """Chunk vectors in the open scopes of the (first list's) index."""
        return await self._lists[0].index.num_vectors()

    async def ping_index(self) -> None:
        """Reach the knowledge indexes' store; raises IndexUnavailableError."""
        for dense in self._lists:
            await dense.index.ping()

    async def search(
        self,
        tenant_id: int,
        user_pk: int | None,
        query: DenseQuery,
        k: int,
        *,
        with_documents: tuple[bool, bool] | None = None,
    ) -> list[KnowledgeHit]:
        """The best `k` chunks of ready documents, the tenant's shared ones or the user's
        own, best first. `with_documents` (shared, own) says which of the two scopes hold
        documents where the caller read it already (a turn, with its session); else SQL
        is asked.

        With a second list (and the query's second vector), each list's best
        `num_candidates` are fused by standardised scores, every candidate scored by
        both lists, each list weighed by the language of the query and of the chunk;
        the hits' scores are then the fused ones. With one list, a hit's score is its
        similarity to the query."""
        if k <= 0:
            return []
        wanted = [scope_of(tenant_id, None)]
        if user_pk is not None:
            wanted.append(scope_of(tenant_id, user_pk))
        if with_documents is None:
            scopes = await self._searchable(wanted)
        else:
            shared, own = with_documents
            present = {scope_of(tenant_id, None): shared, scope_of(tenant_id, user_pk): own}
            scopes = await self._opened([s for s in wanted if present[s]])
        if not scopes:
            return []
        if len(self._lists) == 1 or query.second is None:
            hits = await _search(self._lists[0].index, scopes, query.vector, k)
            rows = await self._store.list_ready_chunks_by_id(scopes, [h.id for h in hits])
            by_id = {row.id: row for row in rows}
            return [KnowledgeHit(by_id[h.id], h.score) for h in hits if h.id in by_id][:k]
        return await self._fused(scopes, query, query.second, k)

    async def _fused(
        self, scopes: Sequence[int], query: DenseQuery, second: np.ndarray, k: int
    ) -> list[KnowledgeHit]:
        """The two lists' hits fused (`search`); `second`, the query's second vector."""
        fetch = max(k, self._config.num_candidates)
        vectors = [query.vector, second]
        rankings = [
            await _search(dense.index, scopes, vector, fetch)
            for dense, vector in zip(self._lists, vectors, strict=True)
        ]
        candidates = sorted({hit.id for ranking in rankings for hit in ranking})
        rows = await self._store.list_ready_chunks_by_id(scopes, candidates)
        by_id = {row.id: row for row in rows}
        # Each list's scores of its own hits, and of the other's hits read from its index.
        exact = []
        for dense, vector, ranking in zip(self._lists, vectors, rankings, strict=True):
            scores = {hit.id: hit.score for hit in ranking}
            scores |= await _similarities(
                dense.index, scopes, vector, set(candidates) - scores.keys()
            )
            exact.append(scores)
        in_cjk = {i for i, row in by_id.items() if is_mostly_cjk(row.text)}
        weights = [dense.weights for dense in self._lists]
        fused = fuse_by_language(rankings, exact, weights, query.is_cjk, in_cjk)
        return [KnowledgeHit(by_id[h.id], h.score) for h in fused if h.id in by_id][:k]

    async def _searchable(self, scopes: list[int]) -> list[int]:
        """The scopes that have documents, loaded for search.

        A scope without documents is not opened (users without knowledge never touch the
        vector store) and is checked again next time, with one query for all of them, as
        another process sharing the database and Chroma server may add documents to it.
        """
        unloaded = [s for s in scopes if not self._is_loaded(s)]
        with_documents = (
            await self._store.list_scopes_with_documents(unloaded) if unloaded else set()
        )
        return await self._opened([s for s in scopes if self._is_loaded(s) or s in with_documents])

    async def _opened(self, scopes: Sequence[int]) -> list[int]:
        """The scopes, each loaded (and reconciled with SQL) on first use."""
        for scope in scopes:
            await self._ensure_scope(scope)
        return list(scopes)

    async def _ensure_scope(self, scope: int) -> None:
        """Load a scope and reconcile it with SQL, once per process: in each list's index
        (a second list added to a store is filled here, chunk by chunk from SQL)."""
        if self._is_loaded(scope):
            return
        lock = self._scope_locks.setdefault(scope, asyncio.Lock())
        async with lock:
            if self._is_loaded(scope):
                return
            sql_ids = await self._store.list_chunk_ids(scope)
            for dense in self._lists:
                if dense.index.is_loaded(scope):
                    continue

                async def add(missing: set[int], dense: _DenseList = dense) -> None:
                    await self._index_chunks(missing, lists=[dense])

                await reconcile(
                    dense.index, scope, sql_ids, add, event="knowledge_scope_reconciled"
                )

    def _is_loaded(self, scope: int) -> bool:
        return all(dense.index.is_loaded(scope) for dense in self._lists)

    async def _index_chunks(
        self,
        ids: Collection[int] | None,
        on_progress: Callable[[int], object] | None = None,
        *,
        lists: Sequence[_DenseList] | None = None,
    ) -> int:
        """Embed stored chunks (those in `ids`, or all) and add them to their scopes, in
        `lists` (default: every list); `on_progress` is told the number of chunks of
        each batch done."""
        if ids is not None and not ids:
            return 0
        chosen_lists = self._lists if lists is None else lists
        num_chunks = 0
        after_id = 0
        batch_size = self._config.embed_batch_size
        while rows := await self._store.list_chunks_after_id(after_id, batch_size, ids):
            texts = [embedding_text(row, row.title) for row in rows]
            for dense in chosen_lists:
                vectors = await dense.embedder.embed(texts)
                for scope in sorted({row.scope for row in rows}):
                    positions = [i for i, row in enumerate(rows) if row.scope == scope]
                    chosen = [rows[i].id for i in positions]
                    await dense.index.add(scope, chosen, vectors[positions])
            num_chunks += len(rows)
            if on_progress is not None:
                on_progress(len(rows))
            after_id = rows[-1].id
        return num_chunks

    async def drop_scope(self, scope: int) -> None:
        """Forget a scope's vectors entirely (its rows are already gone)."""
        async with self._scope_locks.setdefault(scope, asyncio.Lock()):
            for dense in self._lists:
                await dense.index.drop(scope)

    async def reindex_scope(self, scope: int) -> int:
        """Re-embed a scope's chunks from SQL into a fresh scope; returns how many."""
        await self.drop_scope(scope)
        await self._ensure_scope(scope)
        return len(await self._lists[0].index.list_ids(scope))

    async def rebuild(self, on_progress: Callable[[int], object] | None = None) -> int:
        """Drop every knowledge vector and re-embed every stored chunk (`memchat reindex`)."""
        for dense in self._lists:
            await dense.index.drop_all()
        return await self._index_chunks(None, on_progress)

    async def index_stored_chunks(self, chunks: Sequence[tuple[int, int]]) -> None:
        """Embed and index chunks (scope, id) stored without vectors (`memchat import`).

        A scope not open in this process is opened instead: its reconciliation with SQL
        embeds the new chunks with any others it lacks, so none is added twice."""
        by_scope: dict[int, list[int]] = {}
        for scope, chunk_id in chunks:
            by_scope.setdefault(scope, []).append(chunk_id)
        for scope, ids in sorted(by_scope.items()):
            if self._is_loaded(scope):
                await self._index_chunks(ids)
            else:
                await self._ensure_scope(scope)


async def _search(
    index: VectorIndex, scopes: Sequence[int], vector: np.ndarray, k: int
) -> list[ScoredId]:
    hits = [hit for scope in scopes for hit in await index.search(scope, vector, k)]
    return sorted(hits, key=lambda h: (-h.score, h.id))[:k]


async def _similarities(
    index: VectorIndex, scopes: Sequence[int], vector: np.ndarray, ids: Collection[int]
) -> dict[int, float]:
    """The index's similarity of each of `ids` to the vector, whichever scope holds it."""
    found: dict[int, float] = {}
    for scope in scopes:
        found.update(await index.similarities(scope, vector, set(ids) - found.keys()))
    return found
