"""Deterministic fakes that implement the retrieval protocols, for fast unit tests."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections.abc import AsyncIterator, Sequence

import numpy as np

from retrieval.errors import EngineError
from retrieval.protocols import ChatMessage, Completion, SamplingParams, TextDelta

_WORD = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]", re.IGNORECASE)


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _word_id(word: str) -> int:
    return 100 + int.from_bytes(hashlib.sha256(word.encode()).digest()[:3], "big")


class HashEmbedder:
    """Bag of hashed words (and CJK characters): texts sharing words are similar."""

    def __init__(self, dimension: int = 64, model_name: str = "hash-64") -> None:
        self._dimension = dimension
        self._model_name = model_name
        self.num_calls = 0

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def dimension(self) -> int:
        return self._dimension

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_now(texts)

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        self.num_calls += 1
        matrix = np.zeros((len(texts), self._dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in words(text):
                bucket = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big")
                matrix[row, bucket % self._dimension] += 1.0
            norm = np.linalg.norm(matrix[row])
            if norm > 0:
                matrix[row] /= norm
        return matrix


class ScriptedEngine:
    """Replies with scripted texts; one token per word; can be told to fail."""

    def __init__(
        self,
        replies: Sequence[str] = ("Noted.",),
        *,
        context_window: int = 2048,
        fail_after_tokens: int | None = None,
    ) -> None:
        self._replies = list(replies)
        self._context_window = context_window
        self.fail_with: EngineError | None = None
        # When set, generation waits for it (set from another thread) before replying.
        self.gate: threading.Event | None = None
        self.fail_after_tokens = fail_after_tokens
        self.prompts: list[list[ChatMessage]] = []

    @property
    def model_name(self) -> str:
        return "scripted"

    @property
    def context_window(self) -> int:
        return self._context_window

    async def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        return len(self.tokens_now(messages))

    async def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self.tokens_now(messages)

    def tokens_now(self, messages: Sequence[ChatMessage]) -> list[int]:
        # Three template tokens around each message, two for the generation prompt.
        tokens: list[int] = []
        for message in messages:
            tokens += [1, _word_id(message.role)]
            tokens += [_word_id(word) for word in message.content.split()]
            tokens += [2]
        return [*tokens, 1, 3]

    async def generate(self, messages: Sequence[ChatMessage], params: SamplingParams) -> Completion:
        result: Completion | None = None
        async for event in self.stream(messages, params):
            if isinstance(event, Completion):
                result = event
        assert result is not None
        return result

    async def stream(
        self, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> AsyncIterator[TextDelta | Completion]:
        self.prompts.append(list(messages))
        if self.gate is not None:
            await asyncio.to_thread(self.gate.wait, 30)
        if self.fail_with is not None and self.fail_after_tokens is None:
            raise self.fail_with
        reply = self._replies[(len(self.prompts) - 1) % len(self._replies)]
        pieces = reply.split(" ")[: params.max_tokens]
        for position, piece in enumerate(pieces):
            if self.fail_with is not None and position == self.fail_after_tokens:
                raise self.fail_with
            yield TextDelta(piece if position == 0 else " " + piece)
        yield Completion(
            text=" ".join(pieces),
            finish_reason="length" if len(pieces) < len(reply.split(" ")) else "stop",
            prompt_tokens=len(self.tokens_now(messages)),
            completion_tokens=len(pieces),
            cached_prompt_tokens=None,
        )

    async def close(self) -> None:
        return None
