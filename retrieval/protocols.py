"""The pluggable parts of the retrieval layer, as small typed protocols, and their data."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class ScoredId:
    id: int
    score: float


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling for one generation; temperature 0 means greedy (argmax) decoding."""

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    # None when the engine does not report it (or, like vLLM, reports nothing cached).
    cached_prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class IndexLoadResult:
    """How loading one scope of a persisted index went: 'loaded', 'missing' or 'corrupt'."""

    status: str
    ids: frozenset[int] = field(default_factory=frozenset)


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension; the model runs
    off the event loop (the adapter offloads it)."""

    @property
    def model_name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class QueryEmbedder(Protocol):
    """An embedder whose model embeds a search query unlike the texts it searches (e5's
    `query: ` and `passage: ` prefixes): its `embed` gives the vectors of stored texts
    (turns, facts, knowledge chunks), `embed_queries` those of queries. An embedder
    without it embeds both alike, with `embed`."""

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class VocabularyEmbedder(Protocol):
    """An embedder that knows the vectors of its vocabulary's whole words without running
    its model (`retrieval.embedders.vocabulary`): query expansion's single words."""

    def vocabulary_vectors(self, words: Sequence[str]) -> dict[str, np.ndarray]: ...


class VectorIndex(Protocol):
    """Inner-product search over vectors keyed by id (message or chunk), partitioned by an
    integer scope. Derived state: every vector also lives in SQL, so a scope can always
    be rebuilt.

    Every method that may touch storage or the network is async; an adapter around a
    blocking library offloads that work itself (FAISS its files, Chroma every call).
    """

    @property
    def dimension(self) -> int: ...

    def is_loaded(self, scope: int) -> bool:
        """Whether this process has the scope open (in memory: no I/O)."""
        ...

    async def load(self, scope: int) -> IndexLoadResult: ...

    async def reset(self, scope: int) -> None: ...

    async def add(self, scope: int, ids: Sequence[int], vectors: np.ndarray) -> None: ...

    async def remove(self, scope: int, ids: Collection[int]) -> None: ...

    async def search(
        self, scope: int, vector: np.ndarray, k: int, exclude: Collection[int] = ()
    ) -> list[ScoredId]: ...

    async def similarities(
        self, scope: int, vector: np.ndarray, ids: Collection[int]
    ) -> dict[int, float]:
        """The exact inner product of `vector` with each of `ids` held in the scope
        (ids it does not hold are left out)."""
        ...

    async def list_ids(self, scope: int) -> set[int]: ...

    async def num_vectors(self) -> int:
        """Vectors in the scopes this instance has open (loaded or written since it
        started), not those of scopes it has not touched: cheap enough for every scrape
        of the metrics."""
        ...

    async def ping(self) -> None:
        """Reach the store behind the index; raises IndexUnavailableError when it cannot."""
        ...

    async def save(self) -> None: ...

    async def drop_all(self) -> None: ...

    async def drop(self, scope: int) -> None:
        """Forget one scope entirely, in memory and in storage (erasing a user)."""
        ...

    async def unload(self, scope: int) -> None:
        """Close one scope in this process (its changes written first), keeping it in
        storage: the next `load` opens it again."""
        ...


class Engine(Protocol):
    """An LLM engine: chat generation plus its own tokenizer and context window.

    Counting is async like generation: an engine behind a network hop counts with its
    server's tokenizer (vLLM's `/tokenize`), which no turn may wait for on the event
    loop; an in-process engine counts in microseconds and answers at once.
    """

    @property
    def model_name(self) -> str: ...

    @property
    def context_window(self) -> int: ...

    async def count_tokens(self, text: str) -> int: ...

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int: ...

    async def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]: ...

    async def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> Completion: ...

    def stream(
        self, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> AsyncIterator[TextDelta | Completion]: ...

    async def close(self) -> None: ...


@runtime_checkable
class StructuredEngine(Protocol):
    """An engine that can constrain its reply to a JSON schema (a grammar in llama.cpp,
    structured output in vLLM): the reply is JSON text matching `schema`, or the call
    raises an `EngineError`."""

    async def generate_json(
        self, messages: Sequence[ChatMessage], schema: Mapping[str, Any], params: SamplingParams
    ) -> str: ...


@runtime_checkable
class BoundedEngine(Protocol):
    """An engine that bounds a text's token count from below without tokenising it:
    `min_tokens(text) <= count_tokens(text)` for every text, in microseconds. A prompt
    section that is nearly full skips, uncounted, the candidates that cannot fit."""

    def min_tokens(self, text: str) -> int: ...


@runtime_checkable
class MonitoredEngine(Protocol):
    """An engine behind a network hop: its health and its prefix-cache counters.

    `check_health` returns "ok ..." or "error: ..."; `prefix_cache_counters` returns the
    server's (queries, hits) in tokens since it started.
    """

    async def check_health(self) -> str: ...

    async def prefix_cache_counters(self) -> tuple[float, float]: ...
