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
as they are indexed and embedded then (a vocabulary read from SQL rather than from its
snapshot is embedded at the user's first search), dropped with the user. A query's
words are embedded with the query itself (`words_to_embed`), and each asked word keeps
its nearest rows: asked again, only the words added since are compared with it.
CJK text is left to the character n-grams of the lexical index.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from retrieval.search.lexical import word_terms

# Nearest words looked at beyond the wanted number: the asked word and its other forms
# ("paint", "painting") are nearest and skipped.
NUM_SPARE = 5
# The shortest stem taken as the start of another form of its word (`is_other_form`).
MIN_STEM = 4
# Query words whose nearest rows a scope keeps (the least recently asked go first).
MAX_REMEMBERED_WORDS = 512

Embed = Callable[[Sequence[str]], Awaitable[np.ndarray]]


@dataclass(frozen=True, slots=True)
class NeighbourConfig:
    num_neighbours: int = 3  # 0: off
    min_similarity: float = 0.5
    weight: float = 0.3

    @property
    def is_enabled(self) -> bool:
        return self.num_neighbours > 0 and self.weight > 0


@dataclass(frozen=True, slots=True)
class Related:
    """A query's related terms: each one's weight, and the asked word's term it was found
    for (the one that gave it that weight)."""

    weights: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Nearest:
    """A query word's nearest vocabulary rows among the first `upto` rows, best first:
    a later query with the word only scans the rows embedded since."""

    # The word's vector if the user never said it (else it is the vocabulary's row).
    vector: np.ndarray | None
    rows: list[int]
    similarities: list[float]
    upto: int


@dataclass
class _Vocabulary:
    terms: dict[str, str] = field(default_factory=dict)  # word -> index term
    rows: dict[str, int] = field(default_factory=dict)  # embedded word -> row of `matrix`
    words: list[str] = field(default_factory=list)  # embedded words, by row
    # The embedded words' vectors in the first `len(words)` rows; room to grow (doubled
    # when full), so adding words copies the matrix only now and then.
    buffer: np.ndarray | None = None
    pending: dict[str, None] = field(default_factory=dict)  # words still to embed
    # Query words seen lately (oldest first) and their nearest rows.
    nearest: dict[str, _Nearest] = field(default_factory=dict)
    # Vectors of query words made with their query's vector, for its search to take.
    given: dict[str, np.ndarray] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def matrix(self) -> np.ndarray | None:
        return None if self.buffer is None or not self.words else self.buffer[: len(self.words)]

    def append(self, words: Sequence[str], vectors: np.ndarray) -> None:
        size = len(self.words)
        need = size + len(words)
        if self.buffer is None or need > len(self.buffer):
            grown = np.empty((max(need, 2 * size, 1024), vectors.shape[1]), dtype=np.float32)
            if self.buffer is not None:
                grown[:size] = self.buffer[:size]
            self.buffer = grown
        self.buffer[size:need] = vectors
        for word in words:
            self.rows[word] = len(self.words)
            self.words.append(word)


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

    def keep_terms(self, scope: int, terms: Collection[str]) -> None:
        """Forget the words whose index term is not in `terms` (the terms the user's turns
        still hold: words only deleted turns said). A new vocabulary replaces the old, so
        a search under way keeps the rows it reads consistent."""
        vocabulary = self._scopes.get(scope)
        if vocabulary is None or all(term in terms for term in vocabulary.terms.values()):
            return
        kept = _Vocabulary()
        kept.terms = {word: term for word, term in vocabulary.terms.items() if term in terms}
        words = [word for word in vocabulary.words if word in kept.terms]
        if words and vocabulary.buffer is not None:
            rows = [vocabulary.rows[word] for word in words]
            kept.append(words, vocabulary.buffer[rows])
        kept.pending = {word: None for word in vocabulary.pending if word in kept.terms}
        self._scopes[scope] = kept

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
        vocabulary.append(words[: len(matrix)], matrix)
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
        return (await self.related(scope, query, embed)).weights

    async def related(self, scope: int, query: str, embed: Embed) -> Related:
        """As `expand`, with the asked word's term each related term was found for."""
        vocabulary = self._scopes.get(scope)
        asked = word_terms(query)
        if not self._config.is_enabled or vocabulary is None or not asked:
            return Related()
        await self.embed_pending(scope, embed)
        if vocabulary.matrix is None:
            return Related()
        asked_terms = set(asked.values())
        expansion = Related()
        words = list(asked)
        nearests = await self._nearest_of(vocabulary, words, embed)
        for word, nearest in zip(words, nearests, strict=True):
            found = self._related_of(vocabulary, nearest, asked[word], asked_terms)
            for term, weight in found.items():
                if weight > expansion.weights.get(term, 0.0):
                    expansion.weights[term] = weight
                    expansion.sources[term] = asked[word]
        return expansion

    def _related_of(
        self, vocabulary: _Vocabulary, nearest: _Nearest, asked: str, asked_terms: set[str]
    ) -> dict[str, float]:
        """The terms of one asked word's nearest vocabulary words (term `asked`), with
        their weights: another form of it at 1, a related word at weight x cosine."""
        related: dict[str, float] = {}
        num_related = 0
        for row, similarity in zip(nearest.rows, nearest.similarities, strict=True):
            if similarity < self._config.min_similarity:
                break
            term = vocabulary.terms[vocabulary.words[row]]
            if term in asked_terms or term in related:
                continue
            if is_other_form(asked, term):
                related[term] = 1.0
                continue
            related[term] = self._config.weight * similarity
            num_related += 1
            if num_related == self._config.num_neighbours:
                break
        return related

    def words_to_embed(self, scope: int, query: str) -> list[str]:
        """The query's words that its search would embed (neither the user's own words
        nor asked lately): a caller embedding the query may embed them in the same call
        and hand their vectors over (`give_vectors`)."""
        vocabulary = self._scopes.get(scope)
        if not self._config.is_enabled or vocabulary is None:
            return []
        known = (vocabulary.rows, vocabulary.nearest, vocabulary.given)
        return [word for word in word_terms(query) if not any(word in held for held in known)]

    def give_vectors(self, scope: int, words: Sequence[str], vectors: np.ndarray) -> None:
        """Vectors of query words (from `words_to_embed`), for the query's search."""
        vocabulary = self._scopes.get(scope)
        if vocabulary is None:
            return
        for word, vector in zip(words, np.asarray(vectors, dtype=np.float32), strict=True):
            vocabulary.given[word] = vector
        while len(vocabulary.given) > MAX_REMEMBERED_WORDS:
            vocabulary.given.pop(next(iter(vocabulary.given)))

    async def embed_pending(self, scope: int, embed: Embed) -> None:
        """Embed the scope's words not embedded yet (done as turns are indexed, so that
        a search seldom has any left to do)."""
        vocabulary = self._scopes.get(scope)
        if vocabulary is None or not self._config.is_enabled:
            return
        async with vocabulary.lock:
            if not vocabulary.pending:
                return
            words = list(vocabulary.pending)
            # A chat turn's new words were embedded with it, when it was the query.
            held = {w: vector for w in words if (vector := _held(vocabulary, w)) is not None}
            missing = [word for word in words if word not in held]
            if missing:
                held.update(zip(missing, await embed(missing), strict=True))
            vectors = np.stack([held[word] for word in words]).astype(np.float32)
            vocabulary.append(words, vectors)
            for word in words:
                vocabulary.pending.pop(word, None)

    async def _nearest_of(
        self, vocabulary: _Vocabulary, words: list[str], embed: Embed
    ) -> list[_Nearest]:
        """Each word's nearest rows of the whole vocabulary (the most wanted, best first;
        ties: the earlier row): from the word's last query, with only the rows embedded
        since scanned, else scanned in full, the words new to it scanned together."""
        matrix = vocabulary.matrix
        assert matrix is not None
        size = len(vocabulary.words)
        wanted = self._config.num_neighbours + NUM_SPARE
        known = vocabulary.nearest
        new = [word for word in words if word not in known]
        if new:
            vectors = await self._word_vectors(vocabulary, new, embed)
            for word, vector, row in zip(new, vectors, vectors @ matrix.T, strict=True):
                found, similarities = _top(row, wanted, 0)
                own = word in vocabulary.rows
                known[word] = _Nearest(None if own else vector, found, similarities, size)
                vocabulary.given.pop(word, None)
        result = []
        for word in words:
            nearest = known.pop(word)
            known[word] = nearest  # now the most recent
            if nearest.upto < size:
                vector = matrix[vocabulary.rows[word]] if nearest.vector is None else nearest.vector
                row = matrix[nearest.upto :] @ vector
                found, similarities = _top(row, wanted, nearest.upto)
                merged = sorted(
                    zip(
                        [*nearest.similarities, *similarities],
                        [*nearest.rows, *found],
                        strict=True,
                    ),
                    key=lambda pair: (-pair[0], pair[1]),
                )[:wanted]
                nearest.similarities = [similarity for similarity, _ in merged]
                nearest.rows = [row for _, row in merged]
                nearest.upto = size
            result.append(nearest)
        while len(known) > MAX_REMEMBERED_WORDS:
            known.pop(next(iter(known)))
        return result

    @staticmethod
    async def _word_vectors(vocabulary: _Vocabulary, words: list[str], embed: Embed) -> np.ndarray:
        """Vectors of the query's words: rows of the vocabulary where it has them."""
        matrix = vocabulary.matrix
        assert matrix is not None
        rows = vocabulary.rows
        given = vocabulary.given
        unknown = [word for word in words if word not in rows and word not in given]
        fresh = dict(zip(unknown, await embed(unknown), strict=True)) if unknown else {}
        return np.stack(
            [matrix[rows[w]] if w in rows else given[w] if w in given else fresh[w] for w in words]
        ).astype(np.float32)


def is_other_form(first: str, second: str) -> bool:
    """Whether two index terms are forms of one word that the stemmer left apart
    ("allergi" from allergy, "allerg" from allergic; "child", "children"): the shorter,
    of at least MIN_STEM letters, begins the longer. Only asked of words the embedder
    already finds near each other."""
    shorter, longer = sorted((first, second), key=len)
    return len(shorter) >= MIN_STEM and longer.startswith(shorter)


def _held(vocabulary: _Vocabulary, word: str) -> np.ndarray | None:
    """The vector of a word asked lately that the user had not said, if the scope holds
    it."""
    given = vocabulary.given.get(word)
    if given is not None:
        return given
    nearest = vocabulary.nearest.get(word)
    return None if nearest is None else nearest.vector


def _top(similarities: np.ndarray, wanted: int, offset: int) -> tuple[list[int], list[float]]:
    """The rows (numbered from `offset`) of the `wanted` highest similarities and those,
    best first (ties: the earlier row)."""
    wanted = min(wanted, len(similarities))
    if wanted <= 0:
        return [], []
    top = np.argpartition(-similarities, wanted - 1)[:wanted]
    top = top[np.lexsort((top, -similarities[top]))]
    return (top + offset).tolist(), similarities[top].astype(float).tolist()
