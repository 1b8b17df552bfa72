"""A transformer's last hidden state computed by torch in bfloat16, for large batches on
CPUs whose matrix units multiply bfloat16 (AMX).

On such a CPU all-MiniLM-L6-v2 embeds about 2,300 eight-word pieces a second on two
cores in batches of 128, against about 650 for ONNX Runtime in fp32, and its vectors
stay at cosine >= 0.9999 of the fp32 model's (bench/RESULTS.md): the same vectors for
ranking, so they are stored under the model's own name. On CPUs without AMX, bfloat16
without any native bfloat16 it is emulated and slower than fp32, so it is never used
there; with AVX-512's bfloat16 dot products but no AMX it is about 1.4-1.5 times as fast
as fp32 and costs more memory, so it is used there only when asked (`bf16_path_for`).

The model is loaded in a background thread on first demand (torch and the weights take
a few seconds and about 400 MiB): until it is ready, and if loading fails, the caller
keeps using its fp32 path, so no call ever waits for it.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from retrieval.embedders.word_table import WordTable

log = structlog.get_logger(__name__)

# Rows per forward pass: the fastest measured on two cores (64: 2,030/s, 128: 2,280/s,
# 256: 2,180/s, with more memory).
BATCH_SIZE = 128


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them; empty where it does not."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def takes_token_types(model: Any) -> bool:
    """Whether a transformers model's forward takes `token_type_ids` (BERT does)."""
    import inspect

    return "token_type_ids" in inspect.signature(model.forward).parameters


# Models load one after the other (`Bf16Transformer.load`).
_LOAD_LOCK = threading.Lock()


def has_bf16_matrix_units(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX tiles)."""
    flags = cpu_flags() if flags is None else flags
    return {"amx_bf16", "amx_tile"} <= flags


def has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU computes with bfloat16 natively: AMX tiles, or AVX-512's
    bfloat16 dot products (AMD Zen 4, Intel Cooper Lake): there the bfloat16 path is
    faster than fp32 too, by less (bench/RESULTS.md)."""
    flags = cpu_flags() if flags is None else flags
    return has_bf16_matrix_units(flags) or "avx512_bf16" in flags


def bf16_path_for(precision: str) -> bool:
    """Whether an embedder of this precision setting runs its large calls in bfloat16:
    "auto" on CPUs with AMX, "bf16" on any CPU with native bfloat16 (refused on others)."""
    if precision == "bf16":
        if not has_native_bf16():
            raise ValueError(
                "precision bf16 needs a CPU with native bfloat16 (AMX, or AVX-512 BF16); "
                "this one has neither: use auto or fp32"
            )
        return True
    return precision == "auto" and has_bf16_matrix_units()


def release_freed_memory() -> None:
    """Give the C allocator's free pages back to the system (glibc's `malloc_trim`).

    After a large call, the buffers that ONNX Runtime and the tokenizer freed stay in
    glibc's per-thread heaps, counted in the process's resident memory; trimming after
    each bulk call keeps a service that imports history near its idle size. Does
    nothing where the C library has no `malloc_trim`."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, looked up on first use (`find_library` runs `ldconfig`:
    not at import)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


class Bf16Transformer:
    """`last_hidden_state(ids, mask, types)` of the transformer at `model_path`, in
    bfloat16, returned as float32.

    `build_model`, where given, builds the transformers model (float32) instead of
    loading it from `model_path`: for a model whose weights come in another format.
    `word_vectors`, where given, is the model's word embedding table (float32, as the
    ONNX graph reads it, row by row from its file): the tokens' rows go in as
    `inputs_embeds` and the model keeps no table of its own (multilingual-e5-small's is
    250,037 x 384: 190 MB in bfloat16, most of the model)."""

    def __init__(
        self,
        model_path: Path,
        *,
        num_threads: int | None = None,
        build_model: Callable[[], Any] | None = None,
        word_vectors: WordTable | None = None,
    ) -> None:
        self._model_path = model_path
        self._build_model = build_model
        self._word_vectors = word_vectors
        self._num_threads = num_threads
        self._model: Any = None
        self._takes_types = False
        self._started = False
        self._failed = False
        # `_state_lock` guards `_started` only (never held while loading), so `ready`
        # never waits for a load in progress.
        self._state_lock = threading.Lock()
        # torch modules are not safe to call from several threads at once.
        self._call_lock = threading.Lock()
        self._loaded = threading.Event()

    def ready(self) -> bool:
        """Whether the model is loaded; the first call starts loading it in a thread."""
        if self._model is not None:
            return True
        with self._state_lock:
            start, self._started = not self._started, True
        if start:
            # Not a daemon: a process leaving while torch loads would abort in its C++
            # teardown ("terminate called without an active exception"); it waits instead.
            threading.Thread(target=self._load_or_log, name="bf16-load").start()
        return False

    def load(self) -> None:
        """Load the model now, in this thread (idempotent)."""
        # One load at a time in the process: two models loading at once (the default
        # embedder's and the second's) import transformers from two threads, and one
        # of them may find the module half imported ("cannot import name AutoModel").
        with _LOAD_LOCK:
            if self._model is not None:
                return
            # The process must never reach a model hub; weights come from the path only.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import torch
            from transformers import AutoModel

            if self._num_threads:
                torch.set_num_threads(self._num_threads)
            if self._build_model is not None:
                model = self._build_model()
            else:
                model = AutoModel.from_pretrained(str(self._model_path), local_files_only=True)
            if self._word_vectors is not None:
                # The tokens' rows come from the table's file: the model's own goes.
                hidden_size = model.get_input_embeddings().embedding_dim
                model.set_input_embeddings(torch.nn.Embedding(1, hidden_size))
            model = model.to(torch.bfloat16).eval()
            # The float32 weights it was built from are freed: their pages go back.
            gc.collect()
            release_freed_memory()
            self._takes_types = takes_token_types(model)
            self._model = model
            self._loaded.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the model is loaded; whether it is."""
        return self._loaded.wait(timeout)

    @property
    def failed(self) -> bool:
        return self._failed

    def _load_or_log(self) -> None:
        try:
            self.load()
        except Exception as error:
            self._failed = True
            log.warning("bf16_embedder_not_loaded", fallback="fp32", error=repr(error))

    def __call__(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        import torch

        if self._model is None:
            raise RuntimeError("the bfloat16 model is not loaded")
        extra: dict[str, Any] = (
            {"token_type_ids": torch.from_numpy(types)} if self._takes_types else {}
        )
        if self._word_vectors is not None:
            rows = self._word_vectors[ids]
            extra["inputs_embeds"] = torch.from_numpy(rows).to(torch.bfloat16)
        else:
            extra["input_ids"] = torch.from_numpy(ids)
        with self._call_lock, torch.inference_mode():
            out = self._model(attention_mask=torch.from_numpy(mask), **extra)
            return out.last_hidden_state.float().numpy()
