"""Merging ranked lists (dense and lexical) into one, and dropping near-duplicates.

Reciprocal-rank fusion needs no score calibration between retrievers whose scores live
on unrelated scales (cosine vs BM25): each list contributes weight / (c + rank).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from retrieval.protocols import ScoredId


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[ScoredId]],
    weights: Sequence[float] | None = None,
    c: float = 60.0,
) -> list[ScoredId]:
    """Fused ranking, best first; ties go to the better best rank, then the lower id."""
    weights = weights if weights is not None else [1.0] * len(rankings)
    scores: dict[int, float] = {}
    best_rank: dict[int, int] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.id] = scores.get(hit.id, 0.0) + weight / (c + rank)
            best_rank[hit.id] = min(best_rank.get(hit.id, rank), rank)
    order = sorted(scores, key=lambda i: (-scores[i], best_rank[i], i))
    return [ScoredId(i, scores[i]) for i in order]


def drop_near_duplicates(
    hits: Sequence[ScoredId],
    fingerprint: Callable[[int], frozenset[Hashable]],
    threshold: float,
    k: int,
) -> list[ScoredId]:
    """The first k hits, skipping any whose fingerprint (a set of terms) has Jaccard
    similarity >= threshold with a better hit already kept. Empty fingerprints never match.
    """
    kept: list[ScoredId] = []
    seen: list[frozenset[Hashable]] = []
    for hit in hits:
        if len(kept) >= k:
            break
        terms = fingerprint(hit.id)
        if terms and any(jaccard(terms, other) >= threshold for other in seen):
            continue
        kept.append(hit)
        if terms:
            seen.append(terms)
    return kept


def jaccard(first: frozenset[Hashable], second: frozenset[Hashable]) -> float:
    if not first or not second:
        return 0.0
    return len(first & second) / len(first | second)
