"""The composition root: `create_app(settings)` builds the whole object graph.

Heavy parts (embedder, engine) load in the app's lifespan, off the event loop, not at
import or construction time. Tests may pass ready-made parts (fakes or shared real
models); parts passed in are not closed by the app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import EXCEPTION_HANDLERS
from app.openapi import ContractJsonRenderPlugin, ContractSwaggerRenderPlugin
from app.routes.health import healthz, readyz
from app.routes.memory import MemoryController
from app.routes.metrics import EngineMetrics, metrics
from app.routes.sessions import SamplingDefaults, SessionController
from app.settings import EmbedderSettings, EngineSettings, Settings
from retrieval.chat import ChatConfig, ChatService
from retrieval.context import ContextAssembler
from retrieval.memory import TurnMemory
from retrieval.protocols import Embedder, Engine, VectorIndex
from storage import migrate
from storage.db import create_engine, create_sessionmaker
from storage.repository import Store

log = structlog.get_logger(__name__)


def _onnx(config: EmbedderSettings, cache_dir: Path) -> Embedder:
    from retrieval.embedders.onnx import OnnxEmbedder
    from retrieval.embedders.sentence_transformers import default_model_path

    return OnnxEmbedder(
        config.model_path or default_model_path(),
        config.model_name,
        cache_dir,
        batch_size=config.batch_size,
        num_threads=config.num_threads,
    )


def _sentence_transformers(config: EmbedderSettings, _cache_dir: Path) -> Embedder:
    from retrieval.embedders.sentence_transformers import (
        SentenceTransformerEmbedder,
        default_model_path,
    )

    return SentenceTransformerEmbedder(
        config.model_path or default_model_path(),
        config.model_name,
        batch_size=config.batch_size,
        num_threads=config.num_threads,
    )


def _faiss(directory: Path, dimension: int) -> VectorIndex:
    from retrieval.indexes.faiss import FaissIndex

    return FaissIndex(directory, dimension)


def _llamacpp(config: EngineSettings) -> Engine:
    from retrieval.engines.llamacpp import LlamaCppEngine, default_model_path

    return LlamaCppEngine(
        config.model_path or default_model_path(),
        context_window=config.context_window,
        num_threads=config.num_threads,
        timeout_s=config.timeout_s,
    )


def _vllm(config: EngineSettings) -> Engine:
    from retrieval.engines.vllm import VllmEngine

    vllm = config.vllm
    return VllmEngine(
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
    )


EMBEDDERS: dict[str, Callable[[EmbedderSettings, Path], Embedder]] = {
    "onnx": _onnx,
    "sentence-transformers": _sentence_transformers,
}
INDEXES: dict[str, Callable[[Path, int], VectorIndex]] = {"faiss": _faiss}
ENGINES: dict[str, Callable[[EngineSettings], Engine]] = {"llamacpp": _llamacpp, "vllm": _vllm}


class SchemaNotCurrentError(RuntimeError):
    pass


@dataclass
class Runtime:
    db_engine: AsyncEngine
    store: Store
    embedder: Embedder
    engine: Engine
    memory: TurnMemory
    chat: ChatService
    owns_engine: bool = field(default=True)


def load_embedder(settings: Settings) -> Embedder:
    return EMBEDDERS[settings.embedder.kind](settings.embedder, settings.data_dir / "models")


def load_engine(settings: Settings) -> Engine:
    return ENGINES[settings.engine.kind](settings.engine)


def build_index(settings: Settings, embedder: Embedder) -> VectorIndex:
    return INDEXES[settings.index.kind](
        settings.index_dir / settings.index.kind, embedder.dimension
    )


def build_memory(settings: Settings, store: Store, embedder: Embedder) -> TurnMemory:
    return TurnMemory(store, embedder, build_index(settings, embedder))


async def check_schema(db_engine: AsyncEngine) -> None:
    current = await migrate.current_revision(db_engine)
    head = migrate.head_revision()
    if current != head:
        raise SchemaNotCurrentError(
            f"database schema is at revision {current!r}, expected {head!r}: run `memchat migrate`"
        )


async def build_runtime(
    settings: Settings, *, embedder: Embedder | None = None, engine: Engine | None = None
) -> Runtime:
    db_engine = create_engine(
        settings.resolved_database_url(), timeout_s=settings.database_timeout_s
    )
    await check_schema(db_engine)
    store = Store(create_sessionmaker(db_engine))
    owns_engine = engine is None
    if embedder is None:
        embedder = await anyio.to_thread.run_sync(load_embedder, settings)
    if engine is None:
        engine = await anyio.to_thread.run_sync(load_engine, settings)
    memory = build_memory(settings, store, embedder)
    await memory.check_model()
    await memory.repair_unembedded()
    system_prompt = settings.chat.system_prompt_file.read_text(encoding="utf-8").strip()
    chat = ChatService(
        store,
        memory,
        engine,
        ContextAssembler(engine, system_prompt, stable_layout=settings.chat.stable_layout),
        ChatConfig(
            retrieval_k=settings.chat.retrieval_k,
            recent_window_messages=settings.chat.recent_window_messages,
            window_eviction_chunk=settings.chat.window_eviction_chunk,
            memory_share=settings.chat.memory_share,
            max_content_chars=settings.chat.max_content_chars,
            max_import_messages=settings.chat.max_import_messages,
            max_pending_turns=settings.chat.max_pending_turns,
        ),
    )
    return Runtime(db_engine, store, embedder, engine, memory, chat, owns_engine)


async def close_runtime(runtime: Runtime) -> None:
    runtime.memory.save()
    if runtime.owns_engine:
        await runtime.engine.close()
    await runtime.db_engine.dispose()


def create_app(
    settings: Settings, *, embedder: Embedder | None = None, engine: Engine | None = None
) -> Litestar:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        runtime = await build_runtime(settings, embedder=embedder, engine=engine)
        app.state.runtime = runtime
        log.info("memchat_ready", database=runtime.db_engine.url.render_as_string())
        try:
            yield
        finally:
            await close_runtime(runtime)

    def provide_store(state: State) -> Store:
        return state.runtime.store

    def provide_chat_service(state: State) -> ChatService:
        return state.runtime.chat

    def provide_sampling() -> SamplingDefaults:
        return sampling

    sampling = SamplingDefaults(
        max_tokens=settings.engine.max_tokens,
        temperature=settings.engine.temperature,
        top_p=settings.engine.top_p,
        top_k=settings.engine.top_k,
    )
    dependencies: dict[str, Any] = {
        "store": Provide(provide_store, sync_to_thread=False),
        "chat_service": Provide(provide_chat_service, sync_to_thread=False),
        "sampling": Provide(provide_sampling, sync_to_thread=False),
    }
    return Litestar(
        route_handlers=[SessionController, MemoryController, healthz, readyz, metrics],
        state=State({"engine_metrics": EngineMetrics()}),
        dependencies=dependencies,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=[lifespan],
        openapi_config=OpenAPIConfig(
            title="memchat",
            version="0.1.0",
            path="/schema",
            render_plugins=[
                ContractJsonRenderPlugin(settings),
                ContractSwaggerRenderPlugin(settings, path="/swagger"),
            ],
        ),
        request_max_body_size=settings.max_request_bytes,
    )
