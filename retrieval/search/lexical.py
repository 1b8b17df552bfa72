"""Lexical search: BM25 over the indexed text of turns, one in-memory index per user.

Derived state, like the vector index: it is built from SQL when a user's memory is
first used and kept in step by the same calls that add and forget turns, so it never
needs a file of its own and can never disagree with SQL after a restart.

Tokens: Latin-script words are lower-cased, English stop words dropped and the rest
stemmed (Snowball), so "painted" matches "painting". Text without spaces (Chinese,
Japanese, Korean) is cut into single characters and overlapping character pairs: 我对花生过敏
yields 花, 生, 花生, ... and is found by 花生; pairs keep multi-character words ahead of
texts that merely share their characters. (Dictionary words of three characters or more,
from jieba, were terms too until measured: they changed neither MADial-Bench zh nor the
small-store probes, bench/RESULTS.md, and took 61 MiB per process.)
Chinese function characters (的, 了, 什么, ...) are dropped as English stop words are
(`STOP_CHARS`). Other scripts are split on word boundaries.
"""

from __future__ import annotations

import io
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import snowballstemmer

from retrieval.indexes.files import seal, unseal
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

# Chinese function characters, the counterpart of the stop words above: particles,
# pronouns, question words, the copula and the commonest adverbs. Such a character is no
# term on its own, nor is a pair of two of them (什么, 我们, 是的); a pair with one
# content character stays (过敏 holds 过, 有名 holds 有).
STOP_CHARS = frozenset(
    "的了吗呢吧啊呀么嘛哦哈是在有和与也都就还又很这那哪些个一不我你您他她它们什怎谁"
)

_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _stemmer.stemWord(word)


def tokenize(text: str) -> list[str]:
    """Index terms of a text, in order (see the module docstring)."""
    tokens: list[str] = []
    for piece in _TOKEN.findall(unicodedata.normalize("NFKC", text).lower()):
        if CJK_CHAR.match(piece):
            tokens.extend(c for c in piece if c not in STOP_CHARS)
            tokens.extend(
                piece[i : i + 2]
                for i in range(len(piece) - 1)
                if piece[i] not in STOP_CHARS or piece[i + 1] not in STOP_CHARS
            )
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
class _Posting:
    """One term's documents: slots ascending (a removed document's count is 0 until the
    posting is compacted), with the number of live documents and an upper bound of
    their counts (never lowered: a bound only needs to hold)."""

    slots: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    size: int = 0
    df: int = 0
    max_count: float = 0.0

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        return self.slots[: self.size], self.counts[: self.size]

    def extend(self, slots: np.ndarray, counts: np.ndarray) -> None:
        end = self.size + len(slots)
        if end > len(self.slots):
            capacity = max(8, end, 2 * len(self.slots))
            self.slots = np.resize(self.slots, capacity)
            self.counts = np.resize(self.counts, capacity)
        self.slots[self.size : end] = slots
        self.counts[self.size : end] = counts
        self.size = end
        self.df += len(slots)
        self.max_count = max(self.max_count, float(counts.max()))

    def clear(self, slot: int) -> None:
        position = int(np.searchsorted(self.slots[: self.size], slot))
        self.counts[position] = 0.0
        self.df -= 1
        if self.size > 2 * self.df + 16:
            slots, counts = self.view()
            keep = counts > 0
            self.slots, self.counts = slots[keep].copy(), counts[keep].copy()
            self.size = len(self.slots)

    def lookup(self, slots: np.ndarray) -> np.ndarray:
        """The counts of `slots` (ascending) in this posting, 0 where absent."""
        own, counts = self.view()
        positions = np.minimum(np.searchsorted(own, slots), max(self.size - 1, 0))
        found = own[positions] == slots if self.size else np.zeros(len(slots), dtype=bool)
        return np.where(found, counts[positions] if self.size else 0.0, 0.0)


@dataclass
class _Scope:
    """One user's documents. Each document has a slot (its position in the arrays, in
    order of indexing); postings hold slots, so a query adds up scores in arrays over
    the slots instead of merging sets of ids."""

    term_ids: dict[str, int] = field(default_factory=dict)
    terms: list[str] = field(default_factory=list)
    postings: list[_Posting] = field(default_factory=list)
    slot_of: dict[int, int] = field(default_factory=dict)  # document id -> slot
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # -1: gone
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    num_slots: int = 0
    total_length: float = 0.0
    # A lower bound of the live documents' lengths (for the terms' score bounds).
    min_length: float = math.inf
    # Per document: its term ids and weights, and the term ids of its own content.
    documents: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    own_terms: dict[int, np.ndarray] = field(default_factory=dict)
    # Per document asked about (`LexicalIndex.is_mostly_cjk`): its answer, kept until the
    # document is removed or replaced (a search asks it of each of ~100 candidates).
    mostly_cjk: dict[int, bool] = field(default_factory=dict)

    @property
    def num_docs(self) -> int:
        return len(self.documents)

    def term_id(self, term: str) -> int:
        found = self.term_ids.get(term)
        if found is None:
            found = self.term_ids[term] = len(self.terms)
            self.terms.append(term)
            self.postings.append(_Posting())
        return found

    def new_slots(self, count: int) -> np.ndarray:
        end = self.num_slots + count
        if end > len(self.ids):
            capacity = max(64, end, 2 * len(self.ids))
            self.ids = np.resize(self.ids, capacity)
            self.lengths = np.resize(self.lengths, capacity)
        slots = np.arange(self.num_slots, end, dtype=np.int64)
        self.num_slots = end
        return slots


@dataclass(frozen=True, slots=True)
class _Term:
    """A query term as scored: its posting, its weight x idf x (k1 + 1), and the most
    it can add to any document's score."""

    posting: _Posting
    gain: float
    bound: float


class LexicalScores:
    """The BM25 scores of one weighted query: the candidates that hold its top documents
    (ids with their exact scores), and any other document's exact score on request."""

    def __init__(
        self,
        doc_ids: np.ndarray,
        values: np.ndarray,
        exact: Callable[[Collection[int]], dict[int, float]] | None = None,
    ) -> None:
        self.doc_ids = doc_ids
        self.values = values
        self._exact = exact

    @classmethod
    def empty(cls) -> LexicalScores:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0))

    def top(self, k: int, exclude: Collection[int] = ()) -> list[ScoredId]:
        """The k best documents less `exclude`, best first; ties: the lower id. Exact for
        the k (and the excluded ids) the scores were computed for."""
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
        return self._exact(ids) if self._exact is not None else {}


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


# Looking up more documents than this in a posting: spread the posting over an array by
# slot instead of searching it for each document.
_SPREAD_FROM = 256


def _best_after(
    best: np.ndarray, slots: np.ndarray, scores: np.ndarray, seen: np.ndarray, k: int
) -> np.ndarray:
    """The k best seen slots (all of them while fewer) after a term has raised the scores
    of `slots` (ascending), from the k best before it (`best`): no other slot's score
    changed, so the k-th best score is the same as over every seen slot, at the cost of
    the term's posting rather than of the whole scope."""
    if len(slots) and len(best):
        at = np.minimum(np.searchsorted(slots, best), len(slots) - 1)
        best = best[slots[at] != best]
    pool = np.concatenate((best, slots))
    pool = pool[seen[pool]]
    if len(pool) > k:
        pool = pool[np.argpartition(scores[pool], len(pool) - k)[-k:]]
    return pool


def _suffix_sums(bounds: Sequence[float]) -> np.ndarray:
    """The most the terms from each position on can add together, with a margin for
    rounding (and 0 past the last)."""
    return np.append(np.cumsum(bounds[::-1])[::-1] * (1 + 1e-9) + 1e-12, 0.0)


class LexicalIndex:
    """Okapi BM25 (k1, b) over documents keyed by message id, partitioned by scope (user).

    A query's top k is found without scoring every posting (MaxScore): its terms are
    taken by the most each can add to a score per document it holds (any order gives
    the same result; this one takes the cheap, telling terms first), and scored in full
    until the terms left could not together lift a document that none of the taken
    terms holds above the k-th score found so far; the terms left are then only looked
    up for the documents found. The result is the exact top k: a long posting (a
    speaker's name, in every other turn; a related word of low weight) costs only
    lookups.
    """

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
        own: Sequence[str] | None = None,
    ) -> None:
        """Index texts, each with an optional context whose terms count `context_weight`
        times (so a turn's neighbour helps find it without outranking the turn that
        says it); an id already present is replaced. `own` is what each document's
        fingerprint is made of (`fingerprint`; default: its text)."""
        index = self._scopes.setdefault(scope, _Scope())
        self._remove(index, ids)
        contexts = contexts if contexts is not None else [""] * len(texts)
        own = own if own is not None else texts
        slots = index.new_slots(len(ids))
        entry_terms: list[int] = []
        entry_slots: list[int] = []
        entry_counts: list[float] = []
        for doc_id, slot, text, context, content in zip(
            ids, slots.tolist(), texts, contexts, own, strict=True
        ):
            counts: dict[str, float] = dict(Counter(tokenize(text)))
            for term in tokenize(context):
                counts[term] = counts.get(term, 0) + self._context_weight
            term_ids = np.fromiter(
                (index.term_id(t) for t in counts), dtype=np.int32, count=len(counts)
            )
            weights = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            index.documents[doc_id] = (term_ids, weights)
            index.own_terms[doc_id] = np.unique(
                np.fromiter((index.term_id(t) for t in tokenize(content)), dtype=np.int32)
            )
            length = float(weights.sum())
            index.slot_of[doc_id] = slot
            index.ids[slot] = doc_id
            index.lengths[slot] = length
            index.total_length += length
            if length:
                index.min_length = min(index.min_length, length)
            entry_terms.extend(term_ids.tolist())
            entry_slots.extend([slot] * len(counts))
            entry_counts.extend(counts.values())
        if not entry_terms:
            return
        # Grouped by term, slots ascending within each: one append per posting.
        terms = np.asarray(entry_terms, dtype=np.int64)
        order = np.argsort(terms, kind="stable")
        terms = terms[order]
        all_slots = np.asarray(entry_slots, dtype=np.int64)[order]
        all_counts = np.asarray(entry_counts, dtype=np.float64)[order]
        starts = np.flatnonzero(np.r_[True, terms[1:] != terms[:-1]])
        ends = np.r_[starts[1:], len(terms)]
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            index.postings[int(terms[start])].extend(all_slots[start:end], all_counts[start:end])

    def snapshot(self, scope: int) -> bytes | None:
        """The scope as the bytes of a snapshot file (None if not held)."""
        index = self._scopes.get(scope)
        return encode_scope(index) if index is not None else None

    def restore(self, scope: int, data: bytes) -> bool:
        """Take a snapshot's scope; False (and nothing changed) if the bytes are not an
        intact snapshot."""
        index = decode_scope(data)
        if index is None:
            return False
        self._scopes[scope] = index
        return True

    def remove(self, scope: int, ids: Iterable[int]) -> None:
        index = self._scopes.get(scope)
        if index is not None:
            self._remove(index, ids)

    @staticmethod
    def _remove(index: _Scope, ids: Iterable[int]) -> None:
        for doc_id in ids:
            document = index.documents.pop(doc_id, None)
            if document is None:
                continue
            index.own_terms.pop(doc_id, None)
            index.mostly_cjk.pop(doc_id, None)
            slot = index.slot_of.pop(doc_id)
            index.total_length -= index.lengths[slot]
            index.ids[slot] = -1
            index.lengths[slot] = 0.0
            for term_id in document[0].tolist():
                index.postings[term_id].clear(slot)

    def compact(self, scope: int) -> set[str]:
        """Forget the terms that no held document has any more (those of removed ones),
        so that neither the scope nor its snapshot keeps words of deleted text; returns
        the terms left. Term ids are renumbered; postings and slots are unchanged."""
        index = self._scopes.get(scope)
        if index is None:
            return set()
        used = np.zeros(len(index.terms), dtype=bool)
        for term_ids, _weights in index.documents.values():
            used[term_ids] = True
        for own in index.own_terms.values():
            used[own] = True
        if used.all():
            return set(index.terms)
        renumbered = (np.cumsum(used) - 1).astype(np.int32)
        index.terms = [term for term, keep in zip(index.terms, used.tolist(), strict=True) if keep]
        index.term_ids = {term: i for i, term in enumerate(index.terms)}
        index.postings = [
            posting for posting, keep in zip(index.postings, used.tolist(), strict=True) if keep
        ]
        index.documents = {
            doc_id: (renumbered[term_ids], weights)
            for doc_id, (term_ids, weights) in index.documents.items()
        }
        index.own_terms = {doc_id: renumbered[own] for doc_id, own in index.own_terms.items()}
        return set(index.terms)

    def list_ids(self, scope: int) -> set[int]:
        index = self._scopes.get(scope)
        return set(index.documents) if index is not None else set()

    def is_mostly_cjk(self, scope: int, doc_id: int) -> bool:
        """Whether at least half the letters of a document's own content are of the CJK
        scripts, as `retrieval.text.is_mostly_cjk` says of a text, told from its distinct
        terms: each CJK character term one letter, any other term its length (False if
        not held)."""
        index = self._scopes.get(scope)
        if index is None or doc_id not in index.own_terms:
            return False
        known = index.mostly_cjk.get(doc_id)
        if known is None:
            cjk = other = 0
            for term_id in index.own_terms[doc_id].tolist():
                term = index.terms[term_id]
                if not CJK_CHAR.match(term):
                    other += len(term)
                elif len(term) == 1:
                    cjk += 1
            known = index.mostly_cjk[doc_id] = cjk > 0 and 2 * cjk >= other
        return known

    def fingerprint(self, scope: int, doc_id: int) -> frozenset[int]:
        """The distinct terms of a document's own content (empty if not held)."""
        index = self._scopes.get(scope)
        if index is None or doc_id not in index.own_terms:
            return frozenset()
        return frozenset(index.own_terms[doc_id].tolist())

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
        return self.score(scope, weights, k, exclude).top(k, exclude)

    def query_weights(
        self,
        scope: int,
        query: str,
        extra_terms: Mapping[str, float] | None = None,
        exclude: Collection[int] = (),
        sources: Mapping[str, str] | None = None,
    ) -> dict[str, float]:
        """The weighted terms a query is searched with: its own at 1, `extra_terms` (such
        as related words) at theirs, then the feedback terms. An extra term found for an
        asked term (`sources`) that the scope holds counts at most as much as the asked
        term would: its weight is scaled down by their idf ratio where it is rarer (in a
        small store every turn may say "peanut", and a rare related word must not then
        outweigh it).

        With pseudo-relevance feedback on, the query is first run as is, then widened by
        the terms that best characterise its top documents (weighted by their share of
        each document and their idf) at a lower weight: a question worded unlike the turn
        that answers it still shares words with that turn's neighbours.
        """
        weights = dict.fromkeys(tokenize(query), 1.0)
        index = self._scopes.get(scope)
        for term, weight in (extra_terms or {}).items():
            source = (sources or {}).get(term)
            if index is not None and source is not None:
                weight *= self._idf_ratio(index, source, term)
            weights[term] = max(weights.get(term, 0.0), weight)
        feedback = self._feedback
        if (
            index is not None
            and feedback.num_docs
            and feedback.num_terms
            and index.num_docs >= feedback.min_corpus
        ):
            first = self._score(index, weights, feedback.num_docs, exclude).top(
                feedback.num_docs, exclude
            )
            for term in self._expansion(index, first, weights):
                weights[term] = feedback.weight
        return weights

    def score(
        self,
        scope: int,
        weights: Mapping[str, float],
        k: int = 0,
        exclude: Collection[int] = (),
    ) -> LexicalScores:
        """Scores for weighted terms: the exact top k (less `exclude`) and, on request,
        any document's exact score."""
        index = self._scopes.get(scope)
        if index is None or not index.documents:
            return LexicalScores.empty()
        return self._score(index, weights, k, exclude)

    def _idf_ratio(self, index: _Scope, source: str, term: str) -> float:
        """idf(source) / idf(term), at most 1: 1 where either is not held."""
        source_id, term_id = index.term_ids.get(source), index.term_ids.get(term)
        if source_id is None or term_id is None:
            return 1.0
        source_posting, term_posting = index.postings[source_id], index.postings[term_id]
        if not source_posting.df or not term_posting.df:
            return 1.0
        return min(1.0, self._idf(index, source_posting) / self._idf(index, term_posting))

    def _idf(self, index: _Scope, posting: _Posting) -> float:
        df = posting.df
        return math.log(1 + (index.num_docs - df + 0.5) / (df + 0.5))

    def _terms(self, index: _Scope, weights: Mapping[str, float]) -> list[_Term]:
        """The query's terms the scope holds, in the order `_score` takes them: the one
        that can add most for the documents it holds first (its bound over its posting's
        length), so that a long posting of a low bound (a speaker's name, a related word)
        is left for lookups."""
        if index.total_length <= 0:
            return []
        average = index.total_length / index.num_docs
        shortest = min(index.min_length, average)
        norm = self._k1 * (1 - self._b + self._b * shortest / average)
        found = []
        for term, weight in weights.items():
            term_id = index.term_ids.get(term)
            if term_id is None or weight <= 0:
                continue
            posting = index.postings[term_id]
            if not posting.df:
                continue
            gain = weight * self._idf(index, posting) * (self._k1 + 1)
            top = posting.max_count
            found.append(_Term(posting, gain, gain * top / (top + norm)))
        return sorted(found, key=lambda t: -t.bound / t.posting.size)

    def _contribution(
        self, index: _Scope, term: _Term, slots: np.ndarray, counts: np.ndarray
    ) -> np.ndarray:
        average = index.total_length / index.num_docs
        norms = self._k1 * (1 - self._b + self._b * index.lengths[slots] / average)
        return term.gain * counts / (counts + norms)

    def _score(
        self,
        index: _Scope,
        weights: Mapping[str, float],
        k: int,
        exclude: Collection[int] = (),
    ) -> LexicalScores:
        """The exact top k by MaxScore (see the class docstring), over arrays by slot."""
        terms = self._terms(index, weights)

        def exact(ids: Collection[int]) -> dict[int, float]:
            held = sorted(i for i in ids if i in index.slot_of)
            if not held:
                return {}
            slots = np.fromiter((index.slot_of[i] for i in held), dtype=np.int64)
            order = np.argsort(slots)
            ordered = slots[order]
            values = np.zeros(len(ordered))
            spread = np.zeros(index.num_slots) if len(ordered) > _SPREAD_FROM else None
            for term in terms:
                values += self._lookup(index, term, ordered, spread)
            result = dict.fromkeys(held, 0.0)
            result.update(zip(np.asarray(held)[order].tolist(), values.tolist(), strict=True))
            return result

        if not terms or k <= 0:
            return LexicalScores(np.zeros(0, dtype=np.int64), np.zeros(0), exact)
        scores = np.zeros(index.num_slots)
        seen = np.zeros(index.num_slots, dtype=bool)
        # Excluded documents never count: their slots are cleared after each term.
        barred = np.fromiter(
            (index.slot_of[i] for i in exclude if i in index.slot_of), dtype=np.int64
        )
        # The most the terms not yet taken can add, with a margin for rounding.
        bounds = _suffix_sums([t.bound for t in terms])
        taken = 0
        threshold = 0.0
        ceiling = 0.0  # no document's partial score exceeds the taken terms' bounds
        # The k best seen slots so far (see `_best_after`), whose lowest score is the threshold.
        best = np.zeros(0, dtype=np.int64)
        fresh = False  # whether the threshold is the k-th of the scores as they stand
        for term, remaining in zip(terms, bounds[:-1].tolist(), strict=True):
            if taken and remaining < threshold:
                break
            fresh = False
            slots, counts = term.posting.view()
            scores[slots] += self._contribution(index, term, slots, counts)
            seen[slots] = True
            scores[barred] = 0.0
            seen[barred] = False
            taken += 1
            ceiling += term.bound
            best = _best_after(best, slots, scores, seen, k)
            if bounds[taken] >= ceiling:
                continue  # the threshold cannot reach what is left: no need to know it
            if len(best) >= k:
                threshold, fresh = float(scores[best].min()), True
        candidates = np.flatnonzero(seen)
        candidates = candidates[index.ids[candidates] >= 0]
        # The terms left are looked up the one that can add most first: a candidate
        # falls below the threshold soonest.
        left = sorted(terms[taken:], key=lambda t: -t.bound)
        candidates, values = self._complete(
            index,
            left,
            _suffix_sums([t.bound for t in left]),
            candidates,
            scores[candidates],
            (threshold, fresh),
            k,
        )
        return LexicalScores(index.ids[candidates], values, exact)

    def _complete(
        self,
        index: _Scope,
        terms: Sequence[_Term],
        bounds: np.ndarray,
        candidates: np.ndarray,
        values: np.ndarray,
        start: tuple[float, bool],
        k: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best k candidates (with ties) and their exact scores, from their scores by
        the terms taken and `terms`, the ones left (`bounds[i]`: the most terms[i:] can
        add). The terms left are looked up one at a time, the one that can add most
        first: after each, only a document that the terms still left could lift to the
        threshold stays a candidate, and the threshold rises to the k-th best score so far
        (a lower bound of the k-th final one). `start`: the threshold found so far, and
        whether it is already the k-th of `values` (then not sought again). The last
        pass, with nothing left to add, keeps exactly the k best (with ties)."""
        threshold, fresh = start
        spread = np.zeros(index.num_slots) if len(candidates) > _SPREAD_FROM else None
        for position in range(len(terms) + 1):
            remaining = float(bounds[position])
            if len(values) > k and not (fresh and position == 0):
                threshold = max(threshold, float(np.partition(values, len(values) - k)[-k]))
            keep = values + remaining >= threshold
            candidates, values = candidates[keep], values[keep]
            if position == len(terms) or not len(candidates):
                break
            if spread is not None and len(candidates) <= _SPREAD_FROM:
                spread = None
            values = values + self._lookup(index, terms[position], candidates, spread)
        return candidates, values

    def _lookup(
        self, index: _Scope, term: _Term, slots: np.ndarray, spread: np.ndarray | None = None
    ) -> np.ndarray:
        """The scores that `term` gives the documents at `slots` (ascending). With
        `spread` (zeros over every slot, left as found), the posting is spread over it
        and read there, linear in the posting: cheaper than searching the posting for
        each of many documents."""
        if spread is None:
            counts = term.posting.lookup(slots)
        else:
            own, own_counts = term.posting.view()
            spread[own] = own_counts
            counts = spread[slots]
            spread[own] = 0.0
        values = np.zeros(len(slots))
        present = counts > 0
        if present.any():
            values[present] = self._contribution(index, term, slots[present], counts[present])
        return values

    def _expansion(
        self, index: _Scope, top: Sequence[ScoredId], query_terms: Collection[str]
    ) -> list[str]:
        """The feedback terms of the top documents, best first (ties: the smaller term)."""
        value: dict[str, float] = {}
        for hit in top:
            term_ids, counts = index.documents[hit.id]
            length = index.lengths[index.slot_of[hit.id]]
            for term_id, count in zip(term_ids.tolist(), counts.tolist(), strict=True):
                term = index.terms[term_id]
                if term not in query_terms:
                    share = count / length * self._idf(index, index.postings[term_id])
                    value[term] = value.get(term, 0.0) + share
        ordered = sorted(value, key=lambda term: (-value[term], term))
        return ordered[: self._feedback.num_terms]


# Snapshots: a scope's arrays in one file, so that a restart reopens a large history
# without tokenising it again. Format: MAGIC, the SHA-256 of the payload, then the payload
# (numpy's .npz). A file that fails its checksum or does not parse is not used.
# Version 2: Chinese function characters are no longer terms; version 3: Chinese words of
# three characters or more are (an earlier version's file is rebuilt).
SNAPSHOT_MAGIC = b"memchat-bm25-3\n"


def _concatenated(arrays: Sequence[np.ndarray], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Arrays laid end to end, with the offsets that cut them apart again."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    joined: np.ndarray = (
        np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype=dtype)
    )
    return joined, offsets


def _cut(joined: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return np.split(joined, offsets[1:-1]) if len(offsets) > 1 else []


def encode_scope(index: _Scope) -> bytes:
    documents = list(index.documents)
    live = [index.postings[i].view() for i in range(len(index.postings))]
    posting_slots, posting_offsets = _concatenated([p[0] for p in live], np.int64)
    posting_counts, _ = _concatenated([p[1] for p in live], np.float64)
    term_ids, doc_offsets = _concatenated([index.documents[d][0] for d in documents], np.int32)
    weights, _ = _concatenated([index.documents[d][1] for d in documents], np.float64)
    own, own_offsets = _concatenated([index.own_terms[d] for d in documents], np.int32)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        terms=np.asarray(index.terms, dtype=object).astype(str),
        posting_slots=posting_slots,
        posting_counts=posting_counts,
        posting_offsets=posting_offsets,
        posting_df=np.asarray([p.df for p in index.postings], dtype=np.int64),
        posting_max=np.asarray([p.max_count for p in index.postings], dtype=np.float64),
        ids=index.ids[: index.num_slots],
        lengths=index.lengths[: index.num_slots],
        totals=np.asarray([index.total_length, index.min_length]),
        documents=np.asarray(documents, dtype=np.int64),
        doc_terms=term_ids,
        doc_weights=weights,
        doc_offsets=doc_offsets,
        own_terms=own,
        own_offsets=own_offsets,
    )
    return seal(SNAPSHOT_MAGIC, buffer.getvalue())


def decode_scope(data: bytes) -> _Scope | None:
    """The scope in a snapshot's bytes, or None when they are not an intact snapshot."""
    payload = unseal(SNAPSHOT_MAGIC, data)
    if payload is None:
        return None
    try:
        arrays = np.load(io.BytesIO(payload), allow_pickle=False)
        index = _Scope()
        index.terms = [str(t) for t in arrays["terms"].tolist()]
        index.term_ids = {term: i for i, term in enumerate(index.terms)}
        slots = _cut(arrays["posting_slots"], arrays["posting_offsets"])
        counts = _cut(arrays["posting_counts"], arrays["posting_offsets"])
        for own_slots, own_counts, df, top in zip(
            slots,
            counts,
            arrays["posting_df"].tolist(),
            arrays["posting_max"].tolist(),
            strict=True,
        ):
            index.postings.append(_Posting(own_slots, own_counts, len(own_slots), df, top))
        index.ids = arrays["ids"].copy()
        index.lengths = arrays["lengths"].copy()
        index.num_slots = len(index.ids)
        index.total_length, index.min_length = (float(v) for v in arrays["totals"])
        documents = arrays["documents"].tolist()
        terms = _cut(arrays["doc_terms"], arrays["doc_offsets"])
        weights = _cut(arrays["doc_weights"], arrays["doc_offsets"])
        own = _cut(arrays["own_terms"], arrays["own_offsets"])
        index.documents = dict(zip(documents, zip(terms, weights, strict=True), strict=True))
        index.own_terms = dict(zip(documents, own, strict=True))
        live = np.flatnonzero(index.ids >= 0)
        index.slot_of = dict(zip(index.ids[live].tolist(), live.tolist(), strict=True))
    except (ValueError, KeyError, OSError, EOFError):
        return None
    if index.slot_of.keys() != index.documents.keys():
        return None
    return index
