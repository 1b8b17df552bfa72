"""Reciprocal-rank and standardised-score fusion, near-duplicate removal: exact orders
and scores."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval.fusion import (
    LanguageWeights,
    drop_near_duplicates,
    fuse_by_language,
    jaccard,
    reciprocal_rank_fusion,
    shares,
    standardised_by_group,
    standardised_fusion,
)
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


DENSE = [ScoredId(1, 0.9), ScoredId(2, 0.5), ScoredId(3, 0.4)]
LEXICAL = [ScoredId(3, 10.0), ScoredId(4, 2.0), ScoredId(2, 1.0)]
# Every candidate scored by both: turn 1 shares no word (0), turn 4 is far in meaning.
DENSE_EXACT = {1: 0.9, 2: 0.5, 3: 0.4, 4: 0.1}
LEXICAL_EXACT = {1: 0.0, 2: 1.0, 3: 10.0, 4: 2.0}


def z(value: float, own: list[float]) -> float:
    mean = sum(own) / len(own)
    spread = (sum((v - mean) ** 2 for v in own) / len(own)) ** 0.5
    return (value - mean) / spread


def test_standardised_fusion_sums_z_scores_over_each_lists_own_hits() -> None:
    fused = standardised_fusion([DENSE, LEXICAL], [DENSE_EXACT, LEXICAL_EXACT], [1.0, 1.0])
    # z over the own lists: dense 0.9/0.5/0.4, lexical 10/2/1. Turn 3 stands out lexically
    # far more than turn 1 densely; turn 4 is scored by the dense side too (far below).
    assert [h.id for h in fused] == [3, 1, 2, 4]
    dense_own, lexical_own = [0.9, 0.5, 0.4], [10.0, 2.0, 1.0]
    assert fused[0].score == pytest.approx(z(0.4, dense_own) + z(10.0, lexical_own))
    assert fused[-1].score == pytest.approx(z(0.1, dense_own) + z(2.0, lexical_own))
    tilted = standardised_fusion([DENSE, LEXICAL], [DENSE_EXACT, LEXICAL_EXACT], [2.0, 1.0])
    assert [h.id for h in tilted] == [1, 3, 2, 4]


def test_a_weight_given_per_candidate_weighs_each_candidates_score() -> None:
    """The dense side counting nothing for turn 1 (a memory its model cannot read):
    turn 1 keeps only its lexical z-score."""
    per_turn = {1: 0.0, 2: 2.0, 3: 2.0, 4: 2.0}
    fused = standardised_fusion([DENSE, LEXICAL], [DENSE_EXACT, LEXICAL_EXACT], [per_turn, 1.0])
    dense_own, lexical_own = [0.9, 0.5, 0.4], [10.0, 2.0, 1.0]
    scores = {h.id: h.score for h in fused}
    assert scores[1] == pytest.approx(z(0.0, lexical_own))
    assert scores[3] == pytest.approx(2.0 * z(0.4, dense_own) + z(10.0, lexical_own))
    # Weighed 2.0 everywhere, turn 1 leads (test above); its dense score left out, not.
    assert [h.id for h in fused] == [3, 1, 2, 4]


def test_standardised_fusion_without_spread_or_exact_scores() -> None:
    flat = [ScoredId(5, 1.0), ScoredId(6, 1.0)]
    # A list whose hits all score the same adds nothing; ties go to the better best rank
    # (5 and 6 lead their list, 2 is third in the lexical one), then to the lower id.
    fused = standardised_fusion([flat, LEXICAL], [{5: 1.0, 6: 1.0}, LEXICAL_EXACT], [1, 1])
    assert [h.id for h in fused] == [3, 4, 5, 6, 2]
    # A side weighted 0 orders what the other cannot tell apart.
    silent = standardised_fusion([DENSE, []], [DENSE_EXACT, {}], [0.0, 1.0])
    assert [h.id for h in silent] == [1, 2, 3]
    # A candidate a retriever cannot score counts as that list's lowest hit.
    fused = standardised_fusion([DENSE, LEXICAL], [DENSE_EXACT, {3: 10.0}], [0.0, 1.0])
    assert [h.id for h in fused] == [3, 1, 2, 4]
    assert fused[1].score == pytest.approx(z(1.0, [10.0, 2.0, 1.0]))


def test_extra_candidates_no_list_found_are_scored_and_rank_last_on_a_tie() -> None:
    # Turn 7 is found by neither list (a turn said on the day a query names): each list
    # scores it exactly, against its own hits' mean and spread.
    dense_exact = {**DENSE_EXACT, 7: 0.7}
    fused = standardised_fusion([DENSE], [dense_exact], [1.0], extra={7})
    assert [h.id for h in fused] == [1, 7, 2, 3]
    assert fused[1].score == pytest.approx(z(0.7, [0.9, 0.5, 0.4]))
    # One it cannot score counts as its lowest hit, and after the hit it ties with.
    fused = standardised_fusion([DENSE], [DENSE_EXACT], [1.0], extra={7})
    assert [h.id for h in fused] == [1, 2, 3, 7]


def test_a_single_hit_is_standardised_over_every_candidates_exact_score() -> None:
    """One turn holds the query's words: its list has no spread, but the exact scores of
    the other candidates (0: they share no word) give one."""
    single = [ScoredId(3, 2.0)]
    exact = {1: 0.0, 2: 0.0, 3: 2.0}
    fused = standardised_fusion([DENSE, single], [DENSE_EXACT, exact], [0.0, 1.0])
    assert [h.id for h in fused] == [3, 1, 2]
    assert fused[0].score == pytest.approx(z(2.0, [0.0, 0.0, 2.0]))
    # Weighed in, the dense side can outweigh it: turn 1 stands out there more.
    fused = standardised_fusion([DENSE, single], [DENSE_EXACT, exact], [1.0, 1.0])
    assert [h.id for h in fused] == [1, 3, 2]
    assert fused[0].score == pytest.approx(z(0.9, [0.9, 0.5, 0.4]) + z(0.0, [0.0, 0.0, 2.0]))


def test_language_weights_apply_where_the_query_or_the_memory_is_cjk() -> None:
    weights = LanguageWeights(english=0.7, cjk=0.0)
    assert weights.of(True, [1, 2], {2}) == 0.0
    assert weights.of(False, [1, 2], set()) == 0.7
    assert weights.of(False, [1, 2], {2}) == {1: 0.7, 2: 0.0}
    assert LanguageWeights(0.5, 0.5).of(False, [1, 2], {2}) == 0.5


def test_shares_make_each_candidates_weights_sum_to_one() -> None:
    assert shares([{1: 0.7, 2: 0.0}, {1: 0.3, 2: 1.5}], [1, 2]) == [
        {1: pytest.approx(0.7), 2: 0.0},
        {1: pytest.approx(0.3), 2: 1.0},
    ]
    assert shares([0.0, 0.0], [1]) == [{1: 0.0}, {1: 0.0}]


def test_scores_are_standardised_within_each_language() -> None:
    # Chinese memories (4, 5, 6) score lower against an English query than the English
    # ones (1, 2, 3); within each group, the best stands as far above its group.
    scores = {1: 0.9, 2: 0.8, 3: 0.7, 4: 0.8, 5: 0.7, 6: 0.6}
    found = standardised_by_group(scores, {4, 5, 6})
    z = 0.1 / (0.02 / 3) ** 0.5
    assert found == {
        1: pytest.approx(z),
        2: pytest.approx(0.0),
        3: pytest.approx(-z),
        4: pytest.approx(z),
        5: pytest.approx(0.0),
        6: pytest.approx(-z),
    }
    # A group of fewer than three, or without spread: the scores as they are.
    assert standardised_by_group({1: 0.9, 2: 0.8, 3: 0.7, 4: 0.1}, {4}) == {
        1: 0.9,
        2: 0.8,
        3: 0.7,
        4: 0.1,
    }
    flat = {1: 0.9, 2: 0.8, 3: 0.7, 4: 0.5, 5: 0.5, 6: 0.5}
    assert standardised_by_group(flat, {4, 5, 6}) == flat


def test_a_memory_in_the_other_language_can_come_first() -> None:
    # An English query; 1-3 English memories, 4-6 Chinese ones. The first list (English
    # only) weighs nothing on Chinese memories; the multilingual list's similarities are
    # lower for them, but 4 stands out among the Chinese ones as 1 does not among the
    # English ones.
    first = {1: 0.50, 2: 0.45, 3: 0.40, 4: 0.05, 5: 0.04, 6: 0.03}
    second = {1: 0.82, 2: 0.81, 3: 0.80, 4: 0.79, 5: 0.70, 6: 0.69}
    rankings = [
        sorted((ScoredId(i, s) for i, s in scores.items()), key=lambda h: -h.score)
        for scores in (first, second)
    ]
    weights = [LanguageWeights(0.7, 0.0), LanguageWeights(0.3, 1.5)]
    fused = fuse_by_language(rankings, [first, second], weights, False, {4, 5, 6})
    assert [hit.id for hit in fused] == [4, 1, 2, 3, 5, 6]
    # Without the second list's weight on Chinese memories, the English ones lead.
    plain = [LanguageWeights(0.7, 0.0), LanguageWeights(0.3, 0.0)]
    assert [h.id for h in fuse_by_language(rankings, [first, second], plain, False, {4, 5, 6})][
        :3
    ] == [1, 2, 3]


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


@given(
    st.lists(st.frozensets(st.integers(0, 12), max_size=10), min_size=1, max_size=40),
    st.sampled_from([0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0, 1.01]),
    st.integers(1, 40),
)
def test_skipping_sets_of_distant_sizes_keeps_the_same_hits(
    prints: list[frozenset[int]], threshold: float, k: int
) -> None:
    """Only sets of near sizes are compared, copies found by hash: the result is the
    pairwise rule's (above 1, nothing is a duplicate, not even a copy)."""
    hits = ranked(*range(len(prints)))
    kept: list[ScoredId] = []
    for hit in hits:
        terms = prints[hit.id]
        if len(kept) < k and not (
            terms and any(jaccard(terms, prints[h.id]) >= threshold for h in kept)
        ):
            kept.append(hit)
    assert drop_near_duplicates(hits, prints.__getitem__, threshold, k) == kept
