"""The service's object graph: `build_runtime(settings)` loads and wires every part.

Adapters are picked by the settings (`app.adapters`); the retrieval layer's config
objects are built from the settings here, and only here. Tests may pass ready-made
parts (fakes or shared real models); parts passed in are not closed by `close_runtime`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from app.adapters import (
    build_chroma_index,
    build_index,
    load_embedder,
    load_engine,
    load_second_embedder,
)
from app.settings import ChatSettings, KnowledgeSettings, RetrievalSettings, Settings
from retrieval.chat.config import ChatConfig
from retrieval.chat.context import ContextBuilder
from retrieval.chat.conversation import ClientConversation
from retrieval.chat.events import TurnResult
from retrieval.chat.history import HistoryImport
from retrieval.chat.preview import ContextPreview
from retrieval.chat.search import MemorySearch
from retrieval.chat.sessions import ChatSessions, SessionLocks
from retrieval.chat.turn import ChatTurn
from retrieval.dense import SecondDense
from retrieval.facts.llm import LlmFactExtractor
from retrieval.facts.memory import FactMemory
from retrieval.facts.model import FactExtractor
from retrieval.facts.rules import rule_extractor
from retrieval.facts.worker import FactWorker
from retrieval.fusion import LanguageWeights
from retrieval.knowledge.base import KnowledgeBase, KnowledgeConfig
from retrieval.maintenance import MemoryOperations
from retrieval.prompt.layout import ContextAssembler
from retrieval.prompt.reuse import PrefixTracker
from retrieval.protocols import Embedder, Engine, StructuredEngine
from retrieval.search.backfill import SecondListBackfill
from retrieval.search.expansion import NeighbourConfig
from retrieval.search.indexed_text import TextRecipe
from retrieval.search.lexical import Feedback
from retrieval.search.memory import RetrievalConfig, TurnMemory
from retrieval.window.keeper import WindowConfig, WindowKeeper
from retrieval.window.summarizers import ExtractiveSummarizer, LlmSummarizer, Summarizer
from storage import migrate
from storage.claims import JobClaimRepository
from storage.db import Database
from storage.locks import SessionLockRepository
from storage.repositories import Repositories

log = structlog.get_logger(__name__)


class SchemaNotCurrentError(RuntimeError):
    pass


@dataclass
class Runtime:
    repositories: Repositories
    embedder: Embedder
    engine: Engine
    memory: TurnMemory
    knowledge: KnowledgeBase
    facts: FactMemory
    fact_worker: FactWorker | None
    turns: ChatTurn
    previews: ContextPreview
    history: HistoryImport
    conversations: ClientConversation
    sessions: ChatSessions
    search: MemorySearch
    operations: MemoryOperations
    data_dir: Path
    min_free_disk_bytes: int
    owns_engine: bool = field(default=True)
    second_embedder: Embedder | None = None
    second_backfill: SecondListBackfill | None = None

    @property
    def db(self) -> Database:
        return self.repositories.db


# Config objects of the retrieval layer, from the settings ------------------------------


def retrieval_config(settings: RetrievalSettings, reads_cjk: bool = False) -> RetrievalConfig:
    """`reads_cjk`: whether the embedder reads CJK scripts (`EmbedderSettings.reads_cjk`)."""
    cjk_weight = settings.dense_weight_cjk
    if cjk_weight is None:
        cjk_weight = settings.dense_weight if reads_cjk else 0.0
    return RetrievalConfig(
        mode=settings.mode,
        dense_text=TextRecipe(**settings.dense_text.model_dump()),
        lexical_text=TextRecipe(**settings.lexical_text.model_dump()),
        fusion=settings.fusion,
        num_candidates=settings.num_candidates,
        rrf_c=settings.rrf_c,
        dense_weight=settings.dense_weight,
        dense_weight_cjk=cjk_weight,
        second_text=TextRecipe(**settings.second_text.model_dump()),
        second_weight=settings.second_weight,
        second_weight_cjk=settings.second_weight_cjk,
        piece_weight=settings.piece_weight,
        time_boost=settings.time_boost,
        session_weight=settings.session_weight,
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
        max_open_users=settings.max_open_users,
    )


def knowledge_config(config: KnowledgeSettings) -> KnowledgeConfig:
    return KnowledgeConfig(
        chunk_tokens=config.chunk_tokens,
        overlap_tokens=config.overlap_tokens,
        num_candidates=config.num_candidates,
        embed_batch_size=config.embed_batch_size,
        max_document_chars=config.max_document_chars,
        inline_chunks=config.inline_chunks,
        max_upload_bytes=config.max_upload_bytes,
        sweep_interval_s=config.sweep_interval_s,
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
        memory_max_tokens=settings.chat.memory_max_tokens,
        memory_min_tokens=settings.chat.memory_min_tokens,
        excerpt_min_sentences=settings.chat.excerpt_min_sentences,
        facts_share=settings.chat.facts_share,
        max_content_chars=settings.chat.max_content_chars,
        max_import_messages=settings.chat.max_import_messages,
        max_import_chars=settings.chat.max_import_chars,
        max_metadata_bytes=settings.chat.max_metadata_bytes,
        max_pending_turns=settings.chat.max_pending_turns,
        knowledge_k=settings.knowledge.retrieval_k,
        knowledge_share=settings.knowledge.share,
    )


# Parts -----------------------------------------------------------------------------


def build_memory(
    settings: Settings,
    repositories: Repositories,
    embedder: Embedder,
    second_embedder: Embedder | None = None,
) -> TurnMemory:
    second = None
    if second_embedder is not None:
        second = SecondDense(second_embedder, build_index(settings, second_embedder, second=True))
    return TurnMemory(
        repositories.messages,
        repositories.embeddings,
        embedder,
        build_index(settings, embedder),
        retrieval_config(settings.retrieval, settings.embedder.reads_cjk),
        snapshot_dir=settings.index_dir / "bm25",
        second=second,
    )


def build_knowledge(
    settings: Settings,
    repositories: Repositories,
    embedder: Embedder,
    second_embedder: Embedder | None = None,
) -> KnowledgeBase:
    """`second_embedder`: the turns' second model, whose list of the chunks is fused with
    the first's by the turns' dense weights."""
    second = None
    if second_embedder is not None:
        index = build_chroma_index(settings, second_embedder.dimension, "knowledge2")
        second = SecondDense(second_embedder, index)
    return KnowledgeBase(
        repositories.knowledge,
        embedder,
        build_chroma_index(settings, embedder.dimension, "knowledge"),
        knowledge_config(settings.knowledge),
        claims=JobClaimRepository.open_or_none(
            settings.resolved_database_url(), timeout_s=settings.database_timeout_s
        ),
        second=second,
        weights=dense_weights(retrieval_config(settings.retrieval, settings.embedder.reads_cjk)),
    )


def dense_weights(config: RetrievalConfig) -> tuple[LanguageWeights, LanguageWeights]:
    """The first and second dense lists' weights, as the turns' lists have them, for the
    lists of facts and knowledge."""
    return (
        LanguageWeights(config.dense_weight, config.dense_weight_cjk),
        LanguageWeights(config.second_weight, config.second_weight_cjk),
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


async def check_schema(db: Database) -> None:
    current = await migrate.current_revision(db.engine)
    head = migrate.head_revision()
    if current != head:
        raise SchemaNotCurrentError(
            f"database schema is at revision {current!r}, expected {head!r}: run `memchat migrate`"
        )


async def build_runtime(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    second_embedder: Embedder | None = None,
    engine: Engine | None = None,
    on_turn: Callable[[TurnResult], None] | None = None,
    on_import: Callable[[int, int], None] | None = None,
) -> Runtime:
    """`embedder`, where given, replaces the embedders of the settings: the turns' second
    dense list is then `second_embedder`'s (None: no second list). `on_turn` is told every
    finished chat turn, `on_import` every history import's (imported, skipped) counts."""
    db = Database.open(settings.resolved_database_url(), timeout_s=settings.database_timeout_s)
    await check_schema(db)
    repositories = Repositories.of(db)
    owns_engine = engine is None
    if embedder is None:
        embedder = await load_embedder(settings)
        second_embedder = await load_second_embedder(settings)
    engine = engine or await load_engine(settings)
    memory = build_memory(settings, repositories, embedder, second_embedder)
    await memory.check_model()
    await memory.repair_unembedded()
    backfill = None
    if second_embedder is not None:
        backfill = SecondListBackfill(
            memory,
            JobClaimRepository.open_or_none(
                settings.resolved_database_url(), timeout_s=settings.database_timeout_s
            ),
        )
        await backfill.start()
    knowledge = build_knowledge(settings, repositories, embedder, second_embedder)
    await knowledge.start()
    facts = FactMemory(
        repositories.facts,
        repositories.messages,
        build_fact_extractor(settings, engine),
        memory.embed,
        embedder.model_name,
        second=second_embedder,
        weights=dense_weights(retrieval_config(settings.retrieval, settings.embedder.reads_cjk)),
    )
    worker = None
    if settings.facts.extractor != "none":
        worker = FactWorker(facts, sweep_interval_s=settings.facts.sweep_interval_s)
    notify = worker.notify if worker is not None else None
    system_prompt = settings.chat.system_prompt_file.read_text(encoding="utf-8").strip()
    assembler = await ContextAssembler.measured(
        engine, system_prompt, stable_layout=settings.chat.stable_layout
    )
    windows = WindowKeeper(
        repositories.summaries,
        build_summarizer(settings, engine),
        assembler,
        window_config(settings.chat),
    )
    config = chat_config(settings)
    shared_locks = SessionLockRepository.open_or_none(
        settings.resolved_database_url(),
        timeout_s=settings.chat.session_lock_timeout_s,
        connect_timeout_s=settings.database_timeout_s,
    )
    locks, prefixes = SessionLocks(shared_locks), PrefixTracker()
    builder = ContextBuilder(
        memory,
        repositories.messages,
        windows,
        assembler,
        engine,
        prefixes,
        config,
        facts=facts,
        knowledge=knowledge,
    )
    turns = ChatTurn(
        repositories.sessions,
        repositories.messages,
        memory,
        windows,
        builder,
        engine,
        locks,
        prefixes,
        config,
        on_new_messages=notify,
        on_turn=on_turn,
    )
    history = HistoryImport(
        repositories.sessions,
        repositories.messages,
        memory,
        engine,
        locks,
        config,
        on_new_messages=notify,
        on_import=on_import,
    )
    if worker is not None:
        await worker.start()
    return Runtime(
        repositories=repositories,
        embedder=embedder,
        engine=engine,
        memory=memory,
        knowledge=knowledge,
        facts=facts,
        fact_worker=worker,
        turns=turns,
        previews=ContextPreview(repositories.sessions, memory, windows, builder),
        history=history,
        conversations=ClientConversation(
            repositories.sessions, repositories.messages, history, turns
        ),
        sessions=ChatSessions(
            repositories.sessions,
            memory,
            locks,
            prefixes,
            config,
            note_tokens=assembler.note_tokens,
        ),
        search=MemorySearch(
            repositories.messages,
            memory,
            facts,
            knowledge,
            max_query_chars=config.max_content_chars,
        ),
        operations=MemoryOperations(
            repositories.admin, repositories.users, repositories.messages, memory, knowledge
        ),
        data_dir=settings.data_dir,
        min_free_disk_bytes=settings.min_free_disk_bytes,
        owns_engine=owns_engine,
        second_embedder=second_embedder,
        second_backfill=backfill,
    )


async def close_runtime(runtime: Runtime) -> None:
    if runtime.second_backfill is not None:
        await runtime.second_backfill.stop()
    if runtime.fact_worker is not None:
        await runtime.fact_worker.stop()
    await runtime.knowledge.close()
    await runtime.memory.save()
    if runtime.owns_engine:
        await runtime.engine.close()
    await runtime.db.dispose()
