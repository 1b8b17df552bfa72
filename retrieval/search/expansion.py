"""Query expansion by related words from the user's own vocabulary.

A question rarely uses the words of the turn that answers it: "What instrument does
Melanie play?" is answered by "I've been practising the violin". Words relate where
whole sentences blur: the embedder puts "instrument" near "violin", "guitar", "piano".
So each English word of a query brings the `num_neighbours` words nearest to it among
the words the user has actually said (cosine >= `min_similarity`), and their index
terms join the lexical query at `weight` x similarity: found turns must still contain
the words, and a related word never outweighs the asked one.

Only the user's own words are candidates, so nothing unrelated to their history can be
added, and the vocabulary is derived state like the indexes: collected from the turns
as they are indexed, embedded lazily (the first search of a user after a start embeds
their vocabulary, once; later searches embed only new words), dropped with the user.
CJK text is left to the character n-grams of the lexical index.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from retrieval.search.lexical import word_terms

# Nearest words looked at beyond the wanted number: the asked word and its other forms
# ("paint", "painting") are nearest and skipped.
NUM_SPARE = 5

Embed = Callable[[Sequence[str]], Awaitable[np.ndarray]]


@dataclass(frozen=True, slots=True)
class NeighbourConfig:
    num_neighbours: int = 3  # 0: off
    min_similarity: float = 0.5
    weight: float = 0.3

    @property
    def is_enabled(self) -> bool:
        return self.num_neighbours > 0 and self.weight > 0


@dataclass
class _Vocabulary:
    terms: dict[str, str] = field(default_factory=dict)  # word -> index term
    rows: dict[str, int] = field(default_factory=dict)  # embedded word -> row of `matrix`
    words: list[str] = field(default_factory=list)  # embedded words, by row
    matrix: np.ndarray | None = None
    pending: dict[str, None] = field(default_factory=dict)  # words still to embed
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class WordNeighbours:
    """Per-scope (user) vocabularies and their word vectors."""

    def __init__(self, config: NeighbourConfig) -> None:
        self._config = config
        self._scopes: dict[int, _Vocabulary] = {}

    @property
    def config(self) -> NeighbourConfig:
        return self._config

    def add(self, scope: int, texts: Iterable[str]) -> None:
        """Collect the words of texts into the scope's vocabulary (embedded later)."""
        vocabulary = self._scopes.setdefault(scope, _Vocabulary())
        for text in texts:
            for word, term in word_terms(text).items():
                if word not in vocabulary.terms:
                    vocabulary.terms[word] = term
                    vocabulary.pending[word] = None

    def drop(self, scope: int) -> None:
        self._scopes.pop(scope, None)

    def snapshot(self, scope: int) -> dict[str, np.ndarray] | None:
        """The scope's words, their terms and the vectors of those embedded, as arrays
        (None if not held); words still to embed stay to embed."""
        vocabulary = self._scopes.get(scope)
        if vocabulary is None:
            return None
        words = vocabulary.words + list(vocabulary.pending)
        dimension = vocabulary.matrix.shape[1] if vocabulary.matrix is not None else 0
        return {
            "words": np.asarray(words, dtype=str),
            "terms": np.asarray([vocabulary.terms[w] for w in words], dtype=str),
            "matrix": (
                vocabulary.matrix
                if vocabulary.matrix is not None
                else np.zeros((0, dimension), dtype=np.float32)
            ),
        }

    def restore(self, scope: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Take a snapshot's vocabulary: the first `len(matrix)` words embedded."""
        vocabulary = _Vocabulary()
        words = [str(w) for w in arrays["words"].tolist()]
        terms = [str(t) for t in arrays["terms"].tolist()]
        matrix = np.asarray(arrays["matrix"], dtype=np.float32)
        vocabulary.terms = dict(zip(words, terms, strict=True))
        embedded = words[: len(matrix)]
        vocabulary.words = embedded
        vocabulary.rows = {word: row for row, word in enumerate(embedded)}
        vocabulary.matrix = matrix if len(matrix) else None
        vocabulary.pending = dict.fromkeys(words[len(matrix) :])
        self._scopes[scope] = vocabulary

    def num_embedded(self, scope: int) -> int:
        """Words of the scope whose vectors are made."""
        vocabulary = self._scopes.get(scope)
        return len(vocabulary.words) if vocabulary is not None else 0

    def num_words(self, scope: int) -> int:
        vocabulary = self._scopes.get(scope)
        return len(vocabulary.terms) if vocabulary is not None else 0

    async def expand(self, scope: int, query: str, embed: Embed) -> dict[str, float]:
        """Index terms related to the query's words, with their weights; none for words
        sharing a term with the query (they are in it already)."""
        vocabulary = self._scopes.get(scope)
        asked = word_terms(query)
        if not self._config.is_enabled or vocabulary is None or not asked:
            return {}
        await self._embed_pending(vocabulary, embed)
        if vocabulary.matrix is None:
            return {}
        query_vectors = await self._word_vectors(vocabulary, list(asked), embed)
        similarities = query_vectors @ vocabulary.matrix.T
        asked_terms = set(asked.values())
        expansion: dict[str, float] = {}
        for row in similarities:
            related: dict[str, float] = {}
            for position in self._nearest(row):
                term = vocabulary.terms[vocabulary.words[position]]
                if term not in asked_terms and term not in related:
                    related[term] = self._config.weight * float(row[position])
                if len(related) == self._config.num_neighbours:
                    break
            for term, weight in related.items():
                expansion[term] = max(expansion.get(term, 0.0), weight)
        return expansion

    def _nearest(self, similarities: np.ndarray) -> list[int]:
        """Rows of the nearest words at or above the threshold, best first (ties: the
        earlier row); a few more than wanted, as forms of the asked word come first."""
        wanted = min(self._config.num_neighbours + NUM_SPARE, len(similarities))
        top = np.argpartition(-similarities, wanted - 1)[:wanted]
        top = top[np.lexsort((top, -similarities[top]))]
        return [int(i) for i in top if similarities[i] >= self._config.min_similarity]

    @staticmethod
    async def _embed_pending(vocabulary: _Vocabulary, embed: Embed) -> None:
        async with vocabulary.lock:
            if not vocabulary.pending:
                return
            words = list(vocabulary.pending)
            vectors = np.asarray(await embed(words), dtype=np.float32)
            for word in words:
                vocabulary.rows[word] = len(vocabulary.words)
                vocabulary.words.append(word)
            vocabulary.matrix = (
                vectors if vocabulary.matrix is None else np.vstack([vocabulary.matrix, vectors])
            )
            for word in words:
                vocabulary.pending.pop(word, None)

    @staticmethod
    async def _word_vectors(vocabulary: _Vocabulary, words: list[str], embed: Embed) -> np.ndarray:
        """Vectors of the query's words: rows of the vocabulary where it has them."""
        assert vocabulary.matrix is not None
        rows = vocabulary.rows
        unknown = [word for word in words if word not in rows]
        fresh = dict(zip(unknown, await embed(unknown), strict=True)) if unknown else {}
        return np.stack(
            [vocabulary.matrix[rows[w]] if w in rows else fresh[w] for w in words]
        ).astype(np.float32)
