"""Reciprocal-rank fusion and near-duplicate removal: exact orders."""

from __future__ import annotations

import pytest

from retrieval.fusion import drop_near_duplicates, jaccard, reciprocal_rank_fusion
from retrieval.protocols import ScoredId


def ranked(*ids: int) -> list[ScoredId]:
    return [ScoredId(i, 1.0 / (position + 1)) for position, i in enumerate(ids)]


def test_fusion_rewards_agreement_and_breaks_ties_by_best_rank() -> None:
    dense = ranked(1, 2, 3, 4)
    lexical = ranked(3, 5, 1)
    fused = reciprocal_rank_fusion([dense, lexical], c=60)
    # 1: 1/61 + 1/63; 3: 1/63 + 1/61 (equal: both best rank 1, lower id first);
    # then 2 (1/62) and 5 (1/62): same score and best rank 2, lower id first; then 4.
    assert [h.id for h in fused] == [1, 3, 2, 5, 4]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 63)
    assert fused[-1].score == pytest.approx(1 / 64)


def test_weights_tilt_the_fusion() -> None:
    dense = ranked(1, 2)
    lexical = ranked(2, 1)
    assert [h.id for h in reciprocal_rank_fusion([dense, lexical], [2.0, 1.0])] == [1, 2]
    assert [h.id for h in reciprocal_rank_fusion([dense, lexical], [1.0, 2.0])] == [2, 1]
    assert [h.id for h in reciprocal_rank_fusion([dense, []], [1.0, 1.0])] == [1, 2]


def test_near_duplicates_do_not_crowd_the_top_k() -> None:
    prints = {
        1: frozenset({"allerg", "peanut"}),
        2: frozenset({"allerg", "peanut"}),  # the same words again
        3: frozenset({"sister", "berlin"}),
        4: frozenset(),  # nothing to compare: never a duplicate
        5: frozenset(),
        6: frozenset({"sister", "berlin", "emma"}),
    }
    hits = ranked(1, 2, 3, 4, 5, 6)
    assert [h.id for h in drop_near_duplicates(hits, prints.__getitem__, 0.9, 10)] == [
        1, 3, 4, 5, 6,
    ]  # fmt: skip
    assert [h.id for h in drop_near_duplicates(hits, prints.__getitem__, 0.6, 3)] == [1, 3, 4]
    assert jaccard(prints[3], prints[6]) == pytest.approx(2 / 3)
