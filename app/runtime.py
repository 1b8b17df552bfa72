"""The service's object graph: `build_runtime(settings)` loads and wires every part.

Adapters are picked from typed dicts by the settings; heavy imports stay inside the
adapter functions. Tests may pass ready-made parts (fakes or shared real models); parts
passed in are not closed by `close_runtime`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.settings import (
    ChatSettings,
    EmbedderSettings,
    EngineSettings,
    KnowledgeSettings,
    RetrievalSettings,
    Settings,
)
from retrieval.chat.events import TurnResult
from retrieval.chat.service import ChatConfig, ChatService
from retrieval.facts.llm import LlmFactExtractor
from retrieval.facts.memory import FactMemory
from retrieval.facts.rules import rule_extractor
from retrieval.facts.worker import FactWorker
from retrieval.knowledge.base import KnowledgeBase, KnowledgeConfig
from retrieval.maintenance import MemoryOperations
from retrieval.prompt.layout import ContextAssembler
from retrieval.protocols import (
    Embedder,
    Engine,
    FactExtractor,
    StructuredEngine,
    Summarizer,
    VectorIndex,
)
from retrieval.search.expansion import NeighbourConfig
from retrieval.search.indexed_text import TextRecipe
from retrieval.search.lexical import Feedback
from retrieval.search.memory import RetrievalConfig, TurnMemory
from retrieval.window.keeper import WindowConfig, WindowKeeper
from retrieval.window.summarizers import ExtractiveSummarizer, LlmSummarizer
from storage import migrate
from storage.access import AccessStore
from storage.admin import AdminStore
from storage.db import create_engine, create_sessionmaker
from storage.facts import FactStore
from storage.knowledge import KnowledgeStore
from storage.repository import Store
from storage.summaries import SummaryStore

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
        num_slots=config.num_slots,
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
    facts: FactMemory
    fact_worker: FactWorker | None
    access: AccessStore
    operations: MemoryOperations
    summaries: SummaryStore
    knowledge: KnowledgeBase
    data_dir: Path
    min_free_disk_bytes: int
    owns_engine: bool = field(default=True)


def load_embedder(settings: Settings) -> Embedder:
    return EMBEDDERS[settings.embedder.kind](settings.embedder, settings.data_dir / "models")


def load_engine(settings: Settings) -> Engine:
    return ENGINES[settings.engine.kind](settings.engine)


def build_chroma_index(settings: Settings, dimension: int, namespace: str) -> VectorIndex:
    """Embedded Chroma under the data dir, or the server at `chroma_url`; opened on first use."""
    from retrieval.indexes.chroma import ChromaIndex, embedded_client, server_client

    if settings.chroma_url:
        connect = server_client(settings.chroma_url)
    else:
        connect = embedded_client(settings.index_dir / "chroma")
    return ChromaIndex(connect, dimension, namespace=namespace, prefix=settings.chroma_prefix)


def build_knowledge(
    settings: Settings, db_engine: AsyncEngine, embedder: Embedder
) -> KnowledgeBase:
    config = settings.knowledge
    return KnowledgeBase(
        KnowledgeStore(create_sessionmaker(db_engine)),
        embedder,
        build_chroma_index(settings, embedder.dimension, "knowledge"),
        knowledge_config(config),
    )


def knowledge_config(config: KnowledgeSettings) -> KnowledgeConfig:
    return KnowledgeConfig(
        chunk_tokens=config.chunk_tokens,
        overlap_tokens=config.overlap_tokens,
        embed_batch_size=config.embed_batch_size,
        max_document_chars=config.max_document_chars,
        inline_chunks=config.inline_chunks,
        max_upload_bytes=config.max_upload_bytes,
    )


def window_config(config: ChatSettings) -> WindowConfig:
    return WindowConfig(
        max_messages=config.recent_window_messages,
        eviction_chunk=config.window_eviction_chunk,
        low_water=config.window_low_water,
    )


def chat_config(settings: Settings) -> ChatConfig:
    return ChatConfig(
        retrieval_k=settings.chat.retrieval_k,
        summary_share=settings.chat.summary_share,
        memory_share=settings.chat.memory_share,
        facts_share=settings.chat.facts_share,
        max_content_chars=settings.chat.max_content_chars,
        max_import_messages=settings.chat.max_import_messages,
        max_import_chars=settings.chat.max_import_chars,
        max_metadata_bytes=settings.chat.max_metadata_bytes,
        max_pending_turns=settings.chat.max_pending_turns,
        knowledge_k=settings.knowledge.retrieval_k,
        knowledge_share=settings.knowledge.share,
    )


def build_index(settings: Settings, embedder: Embedder) -> VectorIndex:
    if settings.index.kind == "chroma":
        return build_chroma_index(settings, embedder.dimension, "turns")
    return INDEXES[settings.index.kind](
        settings.index_dir / settings.index.kind, embedder.dimension
    )


def retrieval_config(settings: RetrievalSettings) -> RetrievalConfig:
    return RetrievalConfig(
        mode=settings.mode,
        dense_text=TextRecipe(**settings.dense_text.model_dump()),
        lexical_text=TextRecipe(**settings.lexical_text.model_dump()),
        fusion=settings.fusion,
        num_candidates=settings.num_candidates,
        rrf_c=settings.rrf_c,
        dense_weight=settings.dense_weight,
        lexical_weight=settings.lexical_weight,
        duplicate_threshold=settings.duplicate_threshold,
        feedback=Feedback(
            num_docs=settings.feedback_docs,
            num_terms=settings.feedback_terms,
            weight=settings.feedback_weight,
            min_corpus=settings.feedback_min_turns,
        ),
        context_weight=settings.context_weight,
        neighbours=NeighbourConfig(
            num_neighbours=settings.neighbour_words,
            min_similarity=settings.neighbour_min_similarity,
            weight=settings.neighbour_weight,
        ),
    )


def build_memory(settings: Settings, store: Store, embedder: Embedder) -> TurnMemory:
    return TurnMemory(
        store, embedder, build_index(settings, embedder), retrieval_config(settings.retrieval)
    )


def build_fact_extractor(settings: Settings, engine: Engine) -> FactExtractor:
    if settings.facts.extractor != "llm":
        return rule_extractor()
    if not isinstance(engine, StructuredEngine):
        raise ValueError(
            f"MEMCHAT_FACTS__EXTRACTOR=llm needs an engine with JSON-constrained output; "
            f"{engine.model_name!r} has none"
        )
    instructions = settings.facts.prompt_file.read_text(encoding="utf-8").strip()
    return LlmFactExtractor(engine, instructions)


def build_summarizer(settings: Settings, engine: Engine) -> Summarizer:
    if settings.chat.summarizer == "llm":
        instructions = settings.chat.summary_prompt_file.read_text(encoding="utf-8").strip()
        return LlmSummarizer(engine, instructions)
    return ExtractiveSummarizer(engine.count_tokens)


async def check_schema(db_engine: AsyncEngine) -> None:
    current = await migrate.current_revision(db_engine)
    head = migrate.head_revision()
    if current != head:
        raise SchemaNotCurrentError(
            f"database schema is at revision {current!r}, expected {head!r}: run `memchat migrate`"
        )


async def build_runtime(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    engine: Engine | None = None,
    on_turn: Callable[[TurnResult], None] | None = None,
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
    knowledge = build_knowledge(settings, db_engine, embedder)
    await knowledge.resume_unfinished()
    system_prompt = settings.chat.system_prompt_file.read_text(encoding="utf-8").strip()
    facts = FactMemory(
        FactStore(store.sessionmaker),
        build_fact_extractor(settings, engine),
        memory.embed,
        embedder.model_name,
    )
    worker = FactWorker(facts) if settings.facts.extractor != "none" else None
    assembler = ContextAssembler(engine, system_prompt, stable_layout=settings.chat.stable_layout)
    summaries = SummaryStore(store.sessionmaker)
    windows = WindowKeeper(
        store,
        summaries,
        build_summarizer(settings, engine),
        assembler,
        window_config(settings.chat),
    )
    chat = ChatService(
        store,
        memory,
        engine,
        assembler,
        chat_config(settings),
        windows=windows,
        facts=facts,
        knowledge=knowledge,
        on_new_messages=worker.notify if worker is not None else None,
        on_turn=on_turn,
    )
    if worker is not None:
        await worker.start()
    return Runtime(
        db_engine,
        store,
        embedder,
        engine,
        memory,
        chat,
        facts,
        worker,
        access=AccessStore(store.sessionmaker),
        operations=MemoryOperations(AdminStore(store.sessionmaker), memory, knowledge),
        summaries=summaries,
        knowledge=knowledge,
        data_dir=settings.data_dir,
        min_free_disk_bytes=settings.min_free_disk_bytes,
        owns_engine=owns_engine,
    )


async def close_runtime(runtime: Runtime) -> None:
    if runtime.fact_worker is not None:
        await runtime.fact_worker.stop()
    await runtime.knowledge.close()
    runtime.memory.save()
    if runtime.owns_engine:
        await runtime.engine.close()
    await runtime.db_engine.dispose()
