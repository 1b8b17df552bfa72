"""A long query searched by each of its sentences as well as whole.

One vector of a whole dialogue or of a message of several sentences is a blend: the
memory that answers one of its sentences is near that sentence, and only half as near
the blend. So a query of three sentences or more is also embedded sentence by sentence
(in the same call of the embedder as the query itself), and a dense list scores a
memory by its similarity to the whole query plus `weight` x its best similarity to any
one sentence (`combined`). The memories each sentence finds join the list's
candidates. A query of one or two sentences is searched as before.

Measured on MADial-Bench (whole dialogues as queries, bench/RESULTS.md): each dense
list alone gains 6-10 points of recall@10, in Chinese (multilingual-e5-small) and in
English (all-MiniLM-L6-v2).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from retrieval.protocols import Embedder, QueryEmbedder, ScoredId, VectorIndex
from retrieval.text import SENTENCE_END

# Sentences of a query searched on their own: from three (a message of two sentences
# is searched as before: the second often leans on the first), at most the last 16 of
# a longer query (what a message ends on is what it asks).
MIN_PIECES = 3
MAX_PIECES = 16
# A piece must hold a letter, a digit or a CJK character ("...", "—" are no sentence).
_WORDLIKE = re.compile(r"\w")
# A transcript's line starts with its speaker ("User:", "<Bart>:", "[Lisa]：") and may
# quote what was said: the label and the quotes are not what the line says. A line that
# is only a tag ("<BOD>", "[end]") says nothing.
_LABEL = re.compile(
    r"^\s*(?:<[^<>\n]{1,40}>|\[[^\[\]\n]{1,40}\]|[^\W\d_][\w'.-]{0,30}(?: [\w'.-]{1,30})?)"
    r"\s*[:：]\s*",
)
_TAG_ONLY = re.compile(r"^\s*(?:<[^<>\n]*>|\[[^\[\]\n]*\])\s*$")
_QUOTES = "\"'“”‘’「」『』"


def query_pieces(query: str) -> list[str]:
    """The query's sentences (at most the last MAX_PIECES, each once), or none where it
    has fewer than MIN_PIECES."""
    pieces: list[str] = []
    seen: set[str] = set()
    for line in query.splitlines():
        if _TAG_ONLY.match(line):
            continue
        said = _LABEL.sub("", line, count=1)
        for part in SENTENCE_END.split(said):
            piece = part.strip().strip(_QUOTES).strip()
            if piece and _WORDLIKE.search(piece) and piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    return pieces[-MAX_PIECES:] if len(pieces) >= MIN_PIECES else []


async def embed_queries(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Vectors of search queries: the embedder's own query vectors where its model tells
    queries apart (`QueryEmbedder`), else as any text."""
    if isinstance(embedder, QueryEmbedder):
        return await embedder.embed_queries(list(texts))
    return await embedder.embed(list(texts))


class QueryVectors:
    """Vectors of query texts (a whole query and its pieces), kept by text for a while:
    the turn embeds them with its own vectors, and the search that follows finds them."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()

    def missing(self, texts: Iterable[str]) -> list[str]:
        """The texts not held, each once, in order."""
        return list(dict.fromkeys(t for t in texts if t not in self._vectors))

    def put(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        for text, vector in zip(texts, np.asarray(vectors, dtype=np.float32), strict=True):
            self._vectors[text] = vector
            self._vectors.move_to_end(text)
        while len(self._vectors) > self._size:
            self._vectors.popitem(last=False)

    def get(self, text: str) -> np.ndarray | None:
        vector = self._vectors.get(text)
        if vector is not None:
            self._vectors.move_to_end(text)
        return vector

    async def of(
        self, texts: Sequence[str], embed: Callable[[list[str]], Awaitable[np.ndarray]]
    ) -> np.ndarray:
        """The texts' vectors (a row each), those not held embedded now (in one call)."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if missing := self.missing(texts):
            self.put(missing, await embed(missing))
        held = {text: self._vectors[text] for text in texts}
        for text in texts:
            self._vectors.move_to_end(text)
        return np.stack([held[text] for text in texts])


def combined(
    whole: Mapping[int, float], pieces: Sequence[Mapping[int, float]], weight: float
) -> dict[int, float]:
    """Each id's similarity to the whole query plus `weight` x its best similarity to a
    piece (ids the whole query's scores hold)."""
    return {
        i: score + weight * max(piece.get(i, score) for piece in pieces)
        for i, score in whole.items()
    }


class PieceScorer:
    """A dense list's scores of memories for a query with pieces: `combined`, the
    similarities of each id computed once."""

    def __init__(
        self,
        index: VectorIndex,
        scope: int,
        whole: np.ndarray,
        pieces: np.ndarray,
        weight: float,
    ) -> None:
        self._index = index
        self._scope = scope
        self._whole = whole
        self._pieces = pieces
        self._weight = weight
        self._scores: dict[int, float] = {}

    async def search(self, k: int, exclude: Collection[int]) -> list[ScoredId]:
        """The best k of what the whole query and each piece find, by combined score."""
        found: set[int] = set()
        for vector in (self._whole, *self._pieces):
            hits = await self._index.search(self._scope, vector, k, exclude)
            found.update(hit.id for hit in hits)
        scores = await self.scores(found)
        order = sorted(scores, key=lambda i: (-scores[i], i))[:k]
        return [ScoredId(i, scores[i]) for i in order]

    async def scores(self, ids: Collection[int]) -> dict[int, float]:
        """The combined score of each id the index holds."""
        if new := [i for i in ids if i not in self._scores]:
            whole = await self._index.similarities(self._scope, self._whole, new)
            pieces = [
                await self._index.similarities(self._scope, vector, whole.keys())
                for vector in self._pieces
            ]
            self._scores.update(combined(whole, pieces, self._weight))
        return {i: self._scores[i] for i in ids if i in self._scores}
