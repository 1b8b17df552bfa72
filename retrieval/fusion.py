"""Merging ranked lists (dense and lexical) into one, and dropping near-duplicates.

Reciprocal-rank fusion needs no score calibration between retrievers whose scores live
on unrelated scales (cosine vs BM25): each list contributes weight / (c + rank). But it
throws the scores away: a turn that one retriever finds far better than all others
counts no more than one that barely leads. Standardised-score fusion keeps them: each
retriever's scores are turned into z-scores over its own hit list (how far above its
typical hit a candidate stands), every candidate is scored by every retriever exactly
(not only those in its list), and the weighted z-scores are summed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.protocols import ScoredId


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[ScoredId]],
    weights: Sequence[float] | None = None,
    c: float = 60.0,
) -> list[ScoredId]:
    """Fused ranking, best first; ties go to the better best rank, then the lower id."""
    weights = weights if weights is not None else [1.0] * len(rankings)
    scores: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.id] = scores.get(hit.id, 0.0) + weight / (c + rank)
    best_rank = best_ranks(rankings)
    order = sorted(scores, key=lambda i: (-scores[i], best_rank[i], i))
    return [ScoredId(i, scores[i]) for i in order]


def best_ranks(rankings: Sequence[Sequence[ScoredId]]) -> dict[int, int]:
    """Each id's best position (0 = first) in any of the lists: the fusions' tie-break."""
    best: dict[int, int] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking):
            best[hit.id] = min(best.get(hit.id, rank), rank)
    return best


def standardised_fusion(
    rankings: Sequence[Sequence[ScoredId]],
    scores: Sequence[Mapping[int, float]],
    weights: Sequence[float | Mapping[int, float]],
    extra: Collection[int] = (),
) -> list[ScoredId]:
    """Fused ranking of the candidates (every id of `rankings`, and the `extra` ids no
    list found, which rank after the found ones on a tie), best first.

    `rankings[i]` is retriever i's own hit list, whose scores give the mean and spread
    its scores are standardised by; `scores[i]` is its exact score of each candidate
    (a candidate it cannot score counts as its lowest hit). Where its hits all score the
    same (a single hit: one turn holds the query's words), its exact scores of all the
    candidates give them; where those do too, it adds nothing. Ties go to the better
    best rank in any list (so a side weighted 0 still orders what nothing else tells
    apart), then to the lower id. A weight may be given per candidate (a mapping: the
    language of each memory can make a retriever's score of it worth less).
    """
    candidates = sorted({hit.id for ranking in rankings for hit in ranking} | set(extra))
    fused = np.zeros(len(candidates))
    for ranking, exact, weight in zip(rankings, scores, weights, strict=True):
        own = np.array([hit.score for hit in ranking])
        if not len(own):
            continue
        floor = float(own.min())
        values = np.array([exact.get(i, floor) for i in candidates])
        spread = own if np.ptp(own) else values
        if np.ptp(spread):
            factor = (
                np.array([weight[i] for i in candidates]) if isinstance(weight, Mapping) else weight
            )
            fused += factor * (values - spread.mean()) / spread.std()
    best_rank = best_ranks(rankings)
    ranks = np.array([best_rank.get(i, len(candidates)) for i in candidates])
    order = np.lexsort((np.array(candidates), ranks, -fused))
    fused_scores = fused.tolist()
    return [ScoredId(candidates[i], fused_scores[i]) for i in order.tolist()]


def drop_near_duplicates(
    hits: Sequence[ScoredId],
    fingerprint: Callable[[int], frozenset[Hashable]],
    threshold: float,
    k: int,
) -> list[ScoredId]:
    """The first k hits, skipping any whose fingerprint (a set of terms) has Jaccard
    similarity >= threshold with a better hit already kept. Empty fingerprints never match.

    Two sets whose sizes differ by more than the threshold allows cannot match (their
    Jaccard similarity is at most the smaller size over the larger), so the kept sets are
    held by size and only those of a near size are compared: with k = 50 that is a few
    pairs, not 1,225, and no loop over the others.
    """
    kept: list[ScoredId] = []
    seen: dict[int, list[frozenset[Hashable]]] = {}
    # A copy of a kept set (Jaccard 1) is found by its hash, before any comparison: a
    # store that repeats a turn ("ok", "thanks", a pasted text) skips its copies cheaply.
    copies: set[frozenset[Hashable]] = set()
    for hit in hits:
        if len(kept) >= k:
            break
        terms = fingerprint(hit.id)
        size = len(terms)
        if terms and (
            (threshold <= 1 and terms in copies)
            or any(
                jaccard(terms, other) >= threshold
                for length in _near_sizes(size, threshold, seen)
                for other in seen[length]
            )
        ):
            continue
        kept.append(hit)
        if terms:
            seen.setdefault(size, []).append(terms)
            copies.add(terms)
    return kept


def _near_sizes(size: int, threshold: float, seen: Mapping[int, object]) -> list[int]:
    """The sizes held in `seen` whose sets may reach `threshold` with a set of `size`
    (min / max of the two sizes at least the threshold), found by trying the few sizes
    around `size` rather than every size held."""
    if threshold <= 0:
        return list(seen)
    low = max(1, math.floor(size * threshold))
    high = math.ceil(size / threshold)
    if high - low >= len(seen):
        candidates: Iterable[int] = seen
    else:
        candidates = (length for length in range(low, high + 1) if length in seen)
    return [length for length in candidates if min(size, length) / max(size, length) >= threshold]


def jaccard(first: frozenset[Hashable], second: frozenset[Hashable]) -> float:
    if not first or not second:
        return 0.0
    return len(first & second) / len(first | second)


@dataclass(frozen=True, slots=True)
class LanguageWeights:
    """A list's fusion weight of a memory: `english` where neither the query nor the
    memory is mostly in CJK script, `cjk` where either is (an English-only model's
    similarity to Chinese text is noise; a multilingual model's counts most there)."""

    english: float
    cjk: float

    def of(
        self, query_is_cjk: bool, candidates: Collection[int], in_cjk: Collection[int]
    ) -> float | dict[int, float]:
        """The weight for `standardised_fusion`: one for all candidates, or one each
        (`in_cjk`: the candidates mostly in CJK script)."""
        if query_is_cjk or self.cjk == self.english or not in_cjk:
            return self.cjk if query_is_cjk else self.english
        return {i: self.cjk if i in in_cjk else self.english for i in candidates}


def standardised_by_group(
    scores: Mapping[int, float], in_group: Collection[int], min_size: int = 3
) -> dict[int, float]:
    """`scores` standardised within each of two groups of ids (those in `in_group` and the
    others), where each holds at least `min_size` ids with scores that differ; else as
    they are. A multilingual model's similarities are lower between languages than
    within one: by group, the best memory in the query's other language stands as far
    above its group as the best in the query's language above its own."""
    groups = [[i for i in scores if i in in_group], [i for i in scores if i not in in_group]]
    values = [np.array([scores[i] for i in group]) for group in groups]
    if any(len(v) < min_size or not np.ptp(v) for v in values):
        return dict(scores)
    found: dict[int, float] = {}
    for group, value in zip(groups, values, strict=True):
        z = (value - value.mean()) / value.std()
        found.update(zip(group, map(float, z), strict=True))
    return found


def shares(
    weights: Sequence[float | Mapping[int, float]], ids: Collection[int]
) -> list[dict[int, float]]:
    """Each id's weights in the lists as shares of their sum (a sum of 0 left as 0)."""
    table = [{i: w[i] if isinstance(w, Mapping) else w for i in ids} for w in weights]
    total = {i: sum(t[i] for t in table) for i in ids}
    return [{i: t[i] / total[i] if total[i] else 0.0 for i in ids} for t in table]


def fuse_by_language(
    rankings: Sequence[Sequence[ScoredId]],
    exact: Sequence[Mapping[int, float]],
    weights: Sequence[LanguageWeights],
    query_is_cjk: bool,
    in_cjk: Collection[int],
) -> list[ScoredId]:
    """Dense lists without a lexical one (facts, knowledge), the last a multilingual
    model's, fused: that list's scores standardised within each language
    (`standardised_by_group`), each candidate's weights taken as shares of their sum
    (a memory in one language can weigh as much as one in the other), then
    `standardised_fusion`."""
    candidates = sorted({hit.id for ranking in rankings for hit in ranking})
    scores = [dict(found) for found in exact]
    scores[-1] = standardised_by_group(scores[-1], in_cjk)
    lists = [list(ranking) for ranking in rankings[:-1]]
    own = {hit.id for hit in rankings[-1]}
    lists.append(
        sorted(
            (ScoredId(i, s) for i, s in scores[-1].items() if i in own),
            key=lambda hit: (-hit.score, hit.id),
        )
    )
    chosen = [w.of(query_is_cjk, candidates, in_cjk) for w in weights]
    return standardised_fusion(lists, scores, shares(chosen, candidates))
