"""Lexical search: BM25 over the indexed text of turns, one in-memory index per user.

Derived state, like the vector index: it is built from SQL when a user's memory is
first used and kept in step by the same calls that add and forget turns, so it never
needs a file of its own and can never disagree with SQL after a restart.

Tokens: Latin-script words are lower-cased, English stop words dropped and the rest
stemmed (Snowball), so "painted" matches "painting". Text without spaces (Chinese,
Japanese, Korean) is cut into single characters and overlapping character pairs: 我对花生过敏
yields 花, 生, 花生, ... and is found by 花生; pairs keep multi-character words ahead of
texts that merely share their characters. Other scripts are split on word boundaries.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import snowballstemmer

from retrieval.protocols import ScoredId
from retrieval.text import CJK, CJK_CHAR

_TOKEN = re.compile(f"[{CJK}]+|[^\\W_{CJK}]+", re.UNICODE)

_STOP_WORDS_TEXT = """
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its
itself just me more most my myself no nor not now of off on once only or other our ours
ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself
yourselves s t d ll m re ve
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _stemmer.stemWord(word)


def tokenize(text: str) -> list[str]:
    """Index terms of a text, in order (see the module docstring)."""
    tokens: list[str] = []
    for piece in _TOKEN.findall(unicodedata.normalize("NFKC", text).lower()):
        if CJK_CHAR.match(piece):
            tokens.extend(piece)
            tokens.extend(piece[i : i + 2] for i in range(len(piece) - 1))
        elif piece not in STOP_WORDS:
            tokens.append(_stem(piece) if piece.isascii() else piece)
    return tokens


def word_terms(text: str) -> dict[str, str]:
    """The English words of a text worth relating to others (not stop words, at least
    three letters), each with its index term: the vocabulary of query expansion."""
    words: dict[str, str] = {}
    for piece in _TOKEN.findall(unicodedata.normalize("NFKC", text).lower()):
        if piece.isascii() and piece.isalpha() and len(piece) >= 3 and piece not in STOP_WORDS:
            words[piece] = _stem(piece)
    return words


@dataclass
class _Scope:
    lengths: dict[int, float] = field(default_factory=dict)
    # Term weights per document: counts, plus `context_weight` per term of its context.
    terms: dict[int, dict[str, float]] = field(default_factory=dict)
    postings: dict[str, dict[int, float]] = field(default_factory=dict)
    total_length: float = 0.0
    # Per term: (doc ids, counts, doc lengths) as arrays, rebuilt after the term changes.
    arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def posting_arrays(self, term: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        cached = self.arrays.get(term)
        if cached is None:
            posting = self.postings.get(term)
            if not posting:
                return None
            ids = np.fromiter(posting.keys(), dtype=np.int64, count=len(posting))
            counts = np.fromiter(posting.values(), dtype=np.float64, count=len(posting))
            lengths = np.fromiter(
                (self.lengths[i] for i in posting), dtype=np.float64, count=len(posting)
            )
            cached = self.arrays[term] = (ids, counts, lengths)
        return cached


@dataclass(frozen=True, slots=True)
class LexicalScores:
    """The BM25 scores of one weighted query: every document sharing a term (ids
    ascending) with its score, and the ids of every document in the scope."""

    doc_ids: np.ndarray
    values: np.ndarray
    held: Collection[int]

    @classmethod
    def empty(cls) -> LexicalScores:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0), frozenset())

    def top(self, k: int, exclude: Collection[int] = ()) -> list[ScoredId]:
        """The k best documents less `exclude`, best first; ties: the lower id."""
        doc_ids, values = self.doc_ids, self.values
        if k <= 0:
            return []
        if exclude and len(doc_ids):
            keep = ~np.isin(doc_ids, np.fromiter(exclude, dtype=np.int64, count=len(exclude)))
            doc_ids, values = doc_ids[keep], values[keep]
        order = np.lexsort((doc_ids, -values))[:k]
        return [ScoredId(int(doc_ids[i]), float(values[i])) for i in order]

    def of(self, ids: Collection[int]) -> dict[int, float]:
        """The score of each of `ids` the scope holds (0 when it shares no term)."""
        found = {doc_id: 0.0 for doc_id in ids if doc_id in self.held}
        if found and len(self.doc_ids):
            wanted = np.fromiter(found, dtype=np.int64, count=len(found))
            keep = np.isin(self.doc_ids, wanted)
            found.update(zip(self.doc_ids[keep].tolist(), self.values[keep].tolist(), strict=True))
        return found


@dataclass(frozen=True, slots=True)
class Feedback:
    """Pseudo-relevance feedback: add the best `num_terms` terms of the first `num_docs`
    results to the query at `weight` (0 docs or 0 terms: off). Only for users with at
    least `min_corpus` turns: in a handful of turns the first results are most of the
    corpus, not a telling few, and feedback would only echo them."""

    num_docs: int = 3
    num_terms: int = 10
    weight: float = 0.3
    min_corpus: int = 50


class LexicalIndex:
    """Okapi BM25 (k1, b) over documents keyed by message id, partitioned by scope (user)."""

    def __init__(
        self,
        k1: float = 1.2,
        b: float = 0.75,
        feedback: Feedback | None = None,
        context_weight: float = 0.5,
    ) -> None:
        self._k1 = k1
        self._b = b
        self._context_weight = context_weight
        self._feedback = feedback or Feedback()
        self._scopes: dict[int, _Scope] = {}

    def is_loaded(self, scope: int) -> bool:
        return scope in self._scopes

    def reset(self, scope: int) -> None:
        self._scopes[scope] = _Scope()

    def drop(self, scope: int) -> None:
        self._scopes.pop(scope, None)

    def add(
        self,
        scope: int,
        ids: Sequence[int],
        texts: Sequence[str],
        contexts: Sequence[str] | None = None,
    ) -> None:
        """Index texts, each with an optional context whose terms count `context_weight`
        times (so a turn's neighbour helps find it without outranking the turn that
        says it); an id already present is replaced."""
        index = self._scopes.setdefault(scope, _Scope())
        self._remove(index, ids)
        contexts = contexts if contexts is not None else [""] * len(texts)
        for doc_id, text, context in zip(ids, texts, contexts, strict=True):
            counts: dict[str, float] = dict(Counter(tokenize(text)))
            for term in tokenize(context):
                counts[term] = counts.get(term, 0) + self._context_weight
            index.terms[doc_id] = counts
            index.lengths[doc_id] = sum(counts.values())
            index.total_length += index.lengths[doc_id]
            for term, count in counts.items():
                index.postings.setdefault(term, {})[doc_id] = count
                index.arrays.pop(term, None)

    def remove(self, scope: int, ids: Iterable[int]) -> None:
        index = self._scopes.get(scope)
        if index is not None:
            self._remove(index, ids)

    @staticmethod
    def _remove(index: _Scope, ids: Iterable[int]) -> None:
        for doc_id in ids:
            counts = index.terms.pop(doc_id, None)
            if counts is None:
                continue
            index.total_length -= index.lengths.pop(doc_id)
            for term in counts:
                posting = index.postings[term]
                del posting[doc_id]
                index.arrays.pop(term, None)
                if not posting:
                    del index.postings[term]

    def list_ids(self, scope: int) -> set[int]:
        index = self._scopes.get(scope)
        return set(index.terms) if index is not None else set()

    def search(
        self,
        scope: int,
        query: str,
        k: int,
        exclude: Collection[int] = (),
        extra_terms: Mapping[str, float] | None = None,
    ) -> list[ScoredId]:
        """The k best documents by BM25, best first; ties broken by the lower id."""
        weights = self.query_weights(scope, query, extra_terms, exclude)
        return self.score(scope, weights).top(k, exclude)

    def query_weights(
        self,
        scope: int,
        query: str,
        extra_terms: Mapping[str, float] | None = None,
        exclude: Collection[int] = (),
    ) -> dict[str, float]:
        """The weighted terms a query is searched with: its own at 1, `extra_terms` (such
        as related words) at theirs, then the feedback terms.

        With pseudo-relevance feedback on, the query is first run as is, then widened by
        the terms that best characterise its top documents (weighted by their share of
        each document and their idf) at a lower weight: a question worded unlike the turn
        that answers it still shares words with that turn's neighbours.
        """
        weights = dict.fromkeys(tokenize(query), 1.0)
        for term, weight in (extra_terms or {}).items():
            weights[term] = max(weights.get(term, 0.0), weight)
        index = self._scopes.get(scope)
        feedback = self._feedback
        if (
            index is not None
            and feedback.num_docs
            and feedback.num_terms
            and len(index.terms) >= feedback.min_corpus
        ):
            first = self._score(index, weights).top(feedback.num_docs, exclude)
            for term in self._expansion(index, first, weights):
                weights[term] = feedback.weight
        return weights

    def score(self, scope: int, weights: Mapping[str, float]) -> LexicalScores:
        """Every document of the scope scored once for weighted terms: enough both to rank
        them and to give any document's exact score."""
        index = self._scopes.get(scope)
        if index is None or not index.terms:
            return LexicalScores.empty()
        return self._score(index, weights)

    def _idf(self, index: _Scope, term: str) -> float:
        num_docs = len(index.terms)
        df = len(index.postings[term])
        return math.log(1 + (num_docs - df + 0.5) / (df + 0.5))

    def _score(self, index: _Scope, weights: Mapping[str, float]) -> LexicalScores:
        """BM25 scores of every document sharing a weighted term, in numpy
        over the postings (a name may be in every turn of a user: its posting is then as
        long as the user's history)."""
        average = index.total_length / len(index.terms)
        found_ids: list[np.ndarray] = []
        found_scores: list[np.ndarray] = []
        for term, weight in weights.items():
            arrays = index.posting_arrays(term)
            if arrays is None:
                continue
            ids, counts, lengths = arrays
            gain = weight * self._idf(index, term) * (self._k1 + 1)
            norms = self._k1 * (1 - self._b + self._b * lengths / average)
            found_ids.append(ids)
            found_scores.append(gain * counts / (counts + norms))
        if not found_ids:
            return LexicalScores(np.zeros(0, dtype=np.int64), np.zeros(0), index.terms.keys())
        doc_ids, positions = np.unique(np.concatenate(found_ids), return_inverse=True)
        values = np.bincount(positions, weights=np.concatenate(found_scores))
        return LexicalScores(doc_ids, values, index.terms.keys())

    def _expansion(
        self, index: _Scope, top: Sequence[ScoredId], query_terms: Collection[str]
    ) -> list[str]:
        """The feedback terms of the top documents, best first (ties: the smaller term)."""
        value: dict[str, float] = {}
        for hit in top:
            counts = index.terms[hit.id]
            length = index.lengths[hit.id]
            for term, count in counts.items():
                if term not in query_terms:
                    share = count / length * self._idf(index, term)
                    value[term] = value.get(term, 0.0) + share
        ordered = sorted(value, key=lambda term: (-value[term], term))
        return ordered[: self._feedback.num_terms]
