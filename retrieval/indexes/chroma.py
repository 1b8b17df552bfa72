"""Chroma adapter of `VectorIndex`: embedded (files under the data dir) or a Chroma server.

Each scope is its own collection, named `<prefix>-<namespace>-<scope>`, so a query only
ever reaches the vectors of one scope: one user's data cannot answer another's query,
and deployments (or tenants) with different prefixes share a server without meeting.
Vectors are always ours (no embedding function: Chroma never loads or downloads a model)
and compared by inner product (`space: ip`), so scores equal FAISS's: Chroma's distance
is `1 - inner product`. Telemetry is off.

Chroma persists every write itself, so `save` has nothing to do; the client is opened on
first use, so a server that is down fails requests (IndexUnavailableError), not start-up.
The client blocks: every call runs in a worker thread, never on the event loop.
Chroma searches an HNSW graph: exact for the small collections of the tests, approximate
(recall below 1) for large ones, unlike FAISS's exact search.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import chromadb
import httpx
import numpy as np
from chromadb.api import ClientAPI
from chromadb.config import Settings as ChromaSettings
from chromadb.errors import ChromaError, NotFoundError

from retrieval.errors import IndexUnavailableError
from retrieval.protocols import IndexLoadResult, ScoredId

PAGE = 5_000


def _settings() -> ChromaSettings:
    return ChromaSettings(anonymized_telemetry=False, allow_reset=False)


def embedded_client(path: Path) -> Callable[[], ClientAPI]:
    """Opens (once per process and path: Chroma shares it) a PersistentClient under `path`."""

    def connect() -> ClientAPI:
        path.mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(path), settings=_settings())

    return connect


def server_client(url: str) -> Callable[[], ClientAPI]:
    """An HttpClient for `http(s)://host:port`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a Chroma server URL: {url!r} (expected http://host:port)")
    ssl = parts.scheme == "https"
    port = parts.port or (443 if ssl else 8000)

    def connect() -> ClientAPI:
        return chromadb.HttpClient(
            host=parts.hostname or "", port=port, ssl=ssl, settings=_settings()
        )

    return connect


@contextmanager
def _translated() -> Iterator[None]:
    """Chroma and transport failures become IndexUnavailableError (a 503 at the edge)."""
    try:
        yield
    except (ChromaError, httpx.HTTPError, ConnectionError, OSError) as exc:
        raise IndexUnavailableError(f"the Chroma vector store failed: {exc}") from exc


class ChromaIndex:
    def __init__(
        self,
        connect: Callable[[], ClientAPI],
        dimension: int,
        *,
        namespace: str,
        prefix: str = "memchat",
    ) -> None:
        self._connect = connect
        self._client: ClientAPI | None = None
        self._dimension = dimension
        self._base = f"{prefix}-{namespace}-"
        self._collections: dict[int, Any] = {}
        self._lock = threading.Lock()

    @property
    def dimension(self) -> int:
        return self._dimension

    def _name(self, scope: int) -> str:
        return f"{self._base}{scope}"

    def _api(self) -> ClientAPI:
        if self._client is None:
            try:
                with _translated():
                    self._client = self._connect()
            except ValueError as exc:  # how chromadb reports a server it cannot reach
                raise IndexUnavailableError(f"the Chroma vector store failed: {exc}") from exc
        return self._client

    def _create(self, scope: int) -> Any:
        return self._api().get_or_create_collection(
            self._name(scope),
            metadata={"dimension": self._dimension},
            configuration={"hnsw": {"space": "ip"}},
            embedding_function=None,
        )

    def _collection(self, scope: int) -> Any:
        """The scope's collection handle; only this and (re)loading hold the lock, so
        searches and writes of different requests reach Chroma in parallel."""
        with self._lock:
            collection = self._collections.get(scope)
            if collection is None:
                collection = self._create(scope)
                self._collections[scope] = collection
            return collection

    def is_loaded(self, scope: int) -> bool:
        return scope in self._collections

    def _load(self, scope: int) -> IndexLoadResult:
        """An existing collection of the wrong dimension is 'corrupt' and replaced empty."""
        with self._lock, _translated():
            try:
                found = self._api().get_collection(self._name(scope), embedding_function=None)
            except (NotFoundError, ValueError):
                self._collections[scope] = self._create(scope)
                return IndexLoadResult("missing")
            if (found.metadata or {}).get("dimension") != self._dimension:
                self._api().delete_collection(self._name(scope))
                self._collections[scope] = self._create(scope)
                return IndexLoadResult("corrupt")
            self._collections[scope] = found
            return IndexLoadResult("loaded", frozenset(self._ids(found)))

    def _reset(self, scope: int) -> None:
        with self._lock, _translated():
            self._collections.pop(scope, None)
            with suppress(NotFoundError, ValueError):
                self._api().delete_collection(self._name(scope))
            self._collections[scope] = self._create(scope)

    def _drop(self, scope: int) -> None:
        with self._lock, _translated():
            self._collections.pop(scope, None)
            with suppress(NotFoundError, ValueError):
                self._api().delete_collection(self._name(scope))

    def _add(self, scope: int, ids: Sequence[int], vectors: np.ndarray) -> None:
        if len(ids) == 0:
            return
        matrix = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), -1)
        if matrix.shape[1] != self._dimension:
            raise ValueError(f"vectors have dimension {matrix.shape[1]}, not {self._dimension}")
        with _translated():
            # Upsert: re-adding an id replaces its vector instead of duplicating it.
            self._collection(scope).upsert(ids=[str(i) for i in ids], embeddings=matrix)

    def _remove(self, scope: int, ids: Collection[int]) -> None:
        if not ids:
            return
        with _translated():
            self._collection(scope).delete(ids=[str(i) for i in ids])

    def _search(
        self, scope: int, vector: np.ndarray, k: int, exclude: Collection[int] = ()
    ) -> list[ScoredId]:
        if k <= 0:
            return []
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        with _translated():
            # Chroma answers with fewer results when the collection holds fewer.
            found = self._collection(scope).query(
                query_embeddings=query, n_results=k + len(exclude), include=["distances"]
            )
        hits = [
            ScoredId(int(i), 1.0 - float(d))
            for i, d in zip(found["ids"][0], found["distances"][0], strict=True)
            if int(i) not in exclude
        ]
        return hits[:k]

    def _similarities(
        self, scope: int, vector: np.ndarray, ids: Collection[int]
    ) -> dict[int, float]:
        if not ids:
            return {}
        with _translated():
            found = self._collection(scope).get(ids=[str(i) for i in ids], include=["embeddings"])
        if not found["ids"]:
            return {}
        matrix = np.asarray(found["embeddings"], dtype=np.float32)
        scores = matrix @ np.asarray(vector, dtype=np.float32).reshape(-1)
        return {int(i): float(s) for i, s in zip(found["ids"], scores, strict=True)}

    def _ids(self, collection: Any) -> set[int]:
        ids: set[int] = set()
        offset = 0
        while True:
            page = collection.get(include=[], limit=PAGE, offset=offset)["ids"]
            ids.update(int(i) for i in page)
            if len(page) < PAGE:
                return ids
            offset += PAGE

    def _list_ids(self, scope: int) -> set[int]:
        with _translated():
            return self._ids(self._collection(scope))

    def _num_vectors(self) -> int:
        """One `count` call per open collection."""
        with self._lock:
            collections = list(self._collections.values())
        with _translated():
            return sum(int(collection.count()) for collection in collections)

    def _ping(self) -> None:
        with _translated():
            self._api().heartbeat()

    def _drop_all(self) -> None:
        """Delete every collection of this prefix and namespace (others are left alone)."""
        with self._lock, _translated():
            self._collections.clear()
            for collection in self._api().list_collections():
                name = collection if isinstance(collection, str) else collection.name
                if name.startswith(self._base) and name[len(self._base) :].lstrip("-").isdigit():
                    self._api().delete_collection(name)

    # The protocol: every call reaches Chroma (a client library that blocks) in a thread.

    async def load(self, scope: int) -> IndexLoadResult:
        return await anyio.to_thread.run_sync(self._load, scope)

    async def reset(self, scope: int) -> None:
        await anyio.to_thread.run_sync(self._reset, scope)

    async def drop(self, scope: int) -> None:
        await anyio.to_thread.run_sync(self._drop, scope)

    async def add(self, scope: int, ids: Sequence[int], vectors: np.ndarray) -> None:
        await anyio.to_thread.run_sync(self._add, scope, ids, vectors)

    async def remove(self, scope: int, ids: Collection[int]) -> None:
        await anyio.to_thread.run_sync(self._remove, scope, ids)

    async def search(
        self, scope: int, vector: np.ndarray, k: int, exclude: Collection[int] = ()
    ) -> list[ScoredId]:
        return await anyio.to_thread.run_sync(self._search, scope, vector, k, exclude)

    async def similarities(
        self, scope: int, vector: np.ndarray, ids: Collection[int]
    ) -> dict[int, float]:
        return await anyio.to_thread.run_sync(self._similarities, scope, vector, ids)

    async def list_ids(self, scope: int) -> set[int]:
        return await anyio.to_thread.run_sync(self._list_ids, scope)

    async def num_vectors(self) -> int:
        return await anyio.to_thread.run_sync(self._num_vectors)

    async def ping(self) -> None:
        await anyio.to_thread.run_sync(self._ping)

    async def save(self) -> None:
        """Nothing to do: Chroma has written every change already."""

    async def unload(self, scope: int) -> None:
        """Forget the scope's collection handle; Chroma holds its vectors."""
        with self._lock:
            self._collections.pop(scope, None)

    async def drop_all(self) -> None:
        await anyio.to_thread.run_sync(self._drop_all)
