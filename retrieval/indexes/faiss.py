"""FAISS adapter: one exact inner-product index per scope (user), persisted as files.

Each scope is an `IndexIDMap2` over `IndexFlatIP`: exact search, ids are message ids.
Files are written atomically (temporary file then rename) so a crash leaves either the
old or the new file, never half of one. Each file carries a SHA-256 of its index: a file
that cannot be read, or whose bytes do not match their checksum (overwritten on disk,
or written by a version without checksums), is reported as corrupt and never used; the
caller rebuilds that scope from SQL, and only the rebuilt index is written back.

The index lives in this process's memory: searches and writes are CPU work of about a
millisecond on 10,000 vectors and run inline; reading and writing files is offloaded.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Collection, Sequence
from pathlib import Path

import anyio
import faiss
import numpy as np

from retrieval.protocols import IndexLoadResult, ScoredId

# File layout: MAGIC, the SHA-256 of the payload (32 bytes), the serialised index.
MAGIC = b"memchat-faiss-1\n"
DIGEST_BYTES = 32


def encode_index(index: faiss.Index) -> bytes:
    payload = faiss.serialize_index(index).tobytes()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def decode_index(data: bytes) -> faiss.Index | None:
    """The index in a file's bytes, or None when they are not an intact file of ours."""
    if not data.startswith(MAGIC):
        return None
    start = len(MAGIC) + DIGEST_BYTES
    digest, payload = data[len(MAGIC) : start], data[start:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        return faiss.deserialize_index(np.frombuffer(payload, dtype=np.uint8))
    except RuntimeError:
        return None


class FaissIndex:
    def __init__(self, directory: Path, dimension: int) -> None:
        self._directory = directory
        self._dimension = dimension
        self._scopes: dict[int, faiss.IndexIDMap2] = {}
        self._dirty: set[int] = set()
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        # Searches are single queries, memory-bound: OpenMP threads only add start-up cost
        # (measured: 1.6 ms with one thread, 1.9 ms with two, at 10k vectors).
        faiss.omp_set_num_threads(1)

    @property
    def dimension(self) -> int:
        return self._dimension

    def _path(self, scope: int) -> Path:
        return self._directory / f"scope-{scope}.faiss"

    def _new(self) -> faiss.IndexIDMap2:
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self._dimension))

    def is_loaded(self, scope: int) -> bool:
        return scope in self._scopes

    async def load(self, scope: int) -> IndexLoadResult:
        return await anyio.to_thread.run_sync(self._load, scope)

    def _load(self, scope: int) -> IndexLoadResult:
        path = self._path(scope)
        with self._lock:
            if not path.exists():
                self._scopes[scope] = self._new()
                return IndexLoadResult("missing")
            index = decode_index(path.read_bytes())
            if (
                index is None
                or index.d != self._dimension
                or not isinstance(index, faiss.IndexIDMap2)
            ):
                self._scopes[scope] = self._new()
                self._dirty.add(scope)
                return IndexLoadResult("corrupt")
            self._scopes[scope] = index
            ids = frozenset(int(i) for i in faiss.vector_to_array(index.id_map))
            return IndexLoadResult("loaded", ids)

    async def reset(self, scope: int) -> None:
        with self._lock:
            self._scopes[scope] = self._new()
            self._dirty.add(scope)

    async def add(self, scope: int, ids: Sequence[int], vectors: np.ndarray) -> None:
        if len(ids) == 0:
            return
        matrix = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), -1)
        if matrix.shape[1] != self._dimension:
            raise ValueError(f"vectors have dimension {matrix.shape[1]}, not {self._dimension}")
        with self._lock:
            index = self._scopes.setdefault(scope, self._new())
            id_array = np.asarray(ids, dtype=np.int64)
            # Re-adding an id replaces its vector instead of duplicating it.
            index.remove_ids(faiss.IDSelectorBatch(id_array))
            index.add_with_ids(matrix, id_array)
            self._dirty.add(scope)

    async def remove(self, scope: int, ids: Collection[int]) -> None:
        if not ids:
            return
        with self._lock:
            index = self._scopes.get(scope)
            if index is None:
                return
            index.remove_ids(faiss.IDSelectorBatch(np.asarray(list(ids), dtype=np.int64)))
            self._dirty.add(scope)

    async def search(
        self, scope: int, vector: np.ndarray, k: int, exclude: Collection[int] = ()
    ) -> list[ScoredId]:
        with self._lock:
            index = self._scopes.get(scope)
            if index is None or index.ntotal == 0 or k <= 0:
                return []
            fetch = min(index.ntotal, k + len(exclude))
            query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
            scores, ids = index.search(query, fetch)
        results = [
            ScoredId(int(i), float(s))
            for s, i in zip(scores[0], ids[0], strict=True)
            if i >= 0 and int(i) not in exclude
        ]
        return results[:k]

    async def similarities(
        self, scope: int, vector: np.ndarray, ids: Collection[int]
    ) -> dict[int, float]:
        with self._lock:
            index = self._scopes.get(scope)
            if index is None or not ids:
                return {}
            wanted = np.fromiter(ids, dtype=np.int64, count=len(ids))
            held = wanted[np.isin(wanted, faiss.vector_to_array(index.id_map))]
            if not len(held):
                return {}
            # IndexIDMap2 keeps a reverse map: each id's vector is found directly.
            matrix = index.reconstruct_batch(held)
        scores = matrix @ np.asarray(vector, dtype=np.float32).reshape(-1)
        return dict(zip(held.tolist(), scores.tolist(), strict=True))

    async def list_ids(self, scope: int) -> set[int]:
        with self._lock:
            index = self._scopes.get(scope)
            if index is None:
                return set()
            return {int(i) for i in faiss.vector_to_array(index.id_map)}

    async def num_vectors(self) -> int:
        with self._lock:
            return sum(int(index.ntotal) for index in self._scopes.values())

    async def ping(self) -> None:
        """Nothing to reach: the open scopes live in this process."""

    async def save(self) -> None:
        await anyio.to_thread.run_sync(self._save)

    def _save(self) -> None:
        """Write every changed scope to disk atomically."""
        with self._lock:
            for scope in sorted(self._dirty):
                self._write(scope)
            self._dirty.clear()

    def _write(self, scope: int) -> None:
        path = self._path(scope)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as handle:
            handle.write(encode_index(self._scopes[scope]))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    async def unload(self, scope: int) -> None:
        await anyio.to_thread.run_sync(self._unload, scope)

    def _unload(self, scope: int) -> None:
        with self._lock:
            if scope not in self._scopes:
                return
            if scope in self._dirty:
                self._write(scope)
                self._dirty.discard(scope)
            del self._scopes[scope]

    async def drop(self, scope: int) -> None:
        await anyio.to_thread.run_sync(self._drop, scope)

    def _drop(self, scope: int) -> None:
        with self._lock:
            self._scopes.pop(scope, None)
            self._dirty.discard(scope)
            self._path(scope).unlink(missing_ok=True)

    async def drop_all(self) -> None:
        await anyio.to_thread.run_sync(self._drop_all)

    def _drop_all(self) -> None:
        with self._lock:
            self._scopes.clear()
            self._dirty.clear()
            for path in self._directory.glob("scope-*.faiss"):
                path.unlink()
