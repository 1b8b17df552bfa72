"""BM25 lexical index: tokens (English and Chinese), exact rankings, updates and removal."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.search.lexical import Feedback, LexicalIndex, tokenize
from retrieval.text import is_mostly_cjk


def test_english_words_are_stemmed_and_stop_words_dropped() -> None:
    assert tokenize("She painted the sunrise; painting is her hobby!") == [
        "paint",
        "sunris",
        "paint",
        "hobbi",
    ]


def test_chinese_is_cut_into_characters_and_pairs() -> None:
    assert tokenize("我对花生过敏") == [
        "对", "花", "生", "过", "敏",
        "我对", "对花", "花生", "生过", "过敏",
    ]  # fmt: skip
    # Function characters are no terms, nor are pairs of two of them (什么), as English
    # stop words are dropped; a pair with one content character stays (么过, 过敏).
    assert tokenize("我有什么过敏的食物吗？") == [
        "过", "敏", "食", "物",
        "么过", "过敏", "敏的", "的食", "食物", "物吗",
    ]  # fmt: skip
    assert tokenize("你们好吗") == ["好", "们好", "好吗"]
    # Mixed text: Latin words and CJK runs are tokenised each their own way.
    assert tokenize("Alice说花生") == ["alic", "说", "花", "生", "说花", "花生"]


def test_full_width_forms_are_normalised() -> None:
    assert tokenize("ＡＢＣ１２３") == tokenize("abc123") == ["abc123"]


def build(texts: dict[int, str]) -> LexicalIndex:
    index = LexicalIndex()
    index.add(1, list(texts), list(texts.values()))
    return index


CHINESE = {
    1: "我对花生过敏",
    2: "我喜欢生活在北京",
    3: "今天天气很好",
    4: "花园里有很多花",
}


def test_chinese_turn_is_found_by_a_chinese_word() -> None:
    index = build(CHINESE)
    hits = index.search(1, "花生", k=4)
    # The turn holding the word 花生 beats turns that only share its characters.
    assert [h.id for h in hits] == [1, 4, 2]
    assert [h.id for h in index.search(1, "过敏", k=4)] == [1]
    assert [h.id for h in index.search(1, "北京", k=4)] == [2]


def test_ranking_is_bm25_with_ties_to_the_lower_id() -> None:
    index = build(
        {
            10: "Caroline went to the LGBTQ support group yesterday",
            11: "Melanie painted a sunrise over the lake",
            12: "Caroline loves the lake",
            13: "the lake, the lake, the lake",
        }
    )
    assert [h.id for h in index.search(1, "support group", k=5)] == [10]
    assert [h.id for h in index.search(1, "Caroline lake", k=5)] == [12, 13, 10, 11]
    # Identical documents score the same: the lower id first.
    index.add(1, [20, 21], ["violin lessons", "violin lessons"])
    assert [h.id for h in index.search(1, "violin", k=5)] == [20, 21]


def test_exclude_replace_remove_and_scopes() -> None:
    index = build({1: "red car", 2: "red boat", 3: "blue car"})
    index.add(2, [9], ["red car"])
    assert [h.id for h in index.search(1, "red car", k=5, exclude={1})] == [2, 3]
    index.add(1, [2], ["green boat"])  # replaces the text of id 2
    assert [h.id for h in index.search(1, "red", k=5)] == [1]
    index.remove(1, [1])
    assert [h.id for h in index.search(1, "red car", k=5)] == [3]
    assert index.list_ids(1) == {2, 3}
    assert [h.id for h in index.search(2, "red car", k=5)] == [9]
    assert index.search(3, "red", k=5) == []
    assert index.search(1, "the of", k=5) == []  # stop words only


def test_feedback_widens_the_query_with_terms_of_the_top_documents() -> None:
    texts = {
        1: "we adopted a puppy named Rex",
        2: "Rex loves chasing balls on the beach",
        3: "the weather is nice today",
    }
    plain = build(texts)
    assert [h.id for h in plain.search(1, "puppy", k=5)] == [1]
    widened = LexicalIndex(feedback=Feedback(num_docs=1, num_terms=3, weight=0.3, min_corpus=3))
    widened.add(1, list(texts), list(texts.values()))
    # Rex, named after the first hit, brings in the second turn; the third shares nothing.
    hits = widened.search(1, "puppy", k=5)
    assert [h.id for h in hits] == [1, 2]
    assert hits[0].score > hits[1].score
    # Chinese text gets the same treatment (all of the first hit's other terms are added).
    chinese = LexicalIndex(feedback=Feedback(num_docs=1, num_terms=20, weight=0.3, min_corpus=3))
    chinese.add(1, [1, 2, 3], ["我的小狗叫旺财", "旺财喜欢海边", "今天下雨"])
    assert [h.id for h in chinese.search(1, "小狗", k=5)] == [1, 2]
    # Below the corpus size feedback needs, the query runs as given.
    small = LexicalIndex(feedback=Feedback(num_docs=1, num_terms=3, weight=0.3, min_corpus=4))
    small.add(1, list(texts), list(texts.values()))
    assert [h.id for h in small.search(1, "puppy", k=5)] == [1]


def test_context_terms_count_less_than_the_turns_own() -> None:
    index = LexicalIndex(context_weight=0.5)
    index.add(1, [1, 2], ["我妹妹住在上海", "Take a look!"], ["好的，我记住了", "我妹妹住在上海"])
    # The turn that says it outranks the next turn that merely follows it.
    assert [h.id for h in index.search(1, "我妹妹住在哪里", k=5)] == [1, 2]
    assert [h.id for h in index.search(1, "好的", k=5)] == [1]  # found by its context alone
    equal = LexicalIndex(context_weight=1.0)
    equal.add(1, [1, 2], ["我妹妹住在上海", "Take a look!"], ["好的，我记住了", "我妹妹住在上海"])
    # Counted in full, the shorter neighbour would win.
    assert [h.id for h in equal.search(1, "我妹妹住在哪里", k=5)] == [2, 1]


def reference_bm25(
    documents: dict[int, str], weights: dict[str, float], k1: float = 1.2, b: float = 0.75
) -> dict[int, float]:
    """Every document's BM25 score for weighted terms, straight from the formula."""
    counts = {doc_id: Counter(tokenize(text)) for doc_id, text in documents.items()}
    average = sum(sum(c.values()) for c in counts.values()) / len(counts)
    scores = dict.fromkeys(documents, 0.0)
    for term, weight in weights.items():
        df = sum(1 for c in counts.values() if term in c)
        if not df:
            continue
        idf = math.log(1 + (len(counts) - df + 0.5) / (df + 0.5))
        for doc_id, c in counts.items():
            if term in c:
                norm = k1 * (1 - b + b * sum(c.values()) / average)
                scores[doc_id] += weight * idf * (k1 + 1) * c[term] / (c[term] + norm)
    return scores


WORDS = ["red", "car", "boat", "blue", "lake", "violin", "花生", "过敏", "dog", "run"]


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join),
        min_size=1,
        max_size=60,
    ),
    query=st.dictionaries(
        st.sampled_from([tokenize(w)[0] for w in WORDS if w.isascii()] + ["花生", "过"]),
        st.sampled_from([0.3, 1.0, 0.24]),
        min_size=1,
    ),
    k=st.integers(1, 20),
    removed=st.sets(st.integers(0, 59), max_size=10),
    excluded=st.sets(st.integers(0, 59), max_size=5),
)
def test_pruned_top_k_is_the_exact_top_k(
    texts: list[str],
    query: dict[str, float],
    k: int,
    removed: set[int],
    excluded: set[int],
) -> None:
    index = LexicalIndex()
    index.add(1, list(range(len(texts))), texts)
    index.remove(1, removed)
    documents = {i: text for i, text in enumerate(texts) if i not in removed}
    if not documents:
        assert index.score(1, query, k).top(k) == []
        return
    expected = reference_bm25(documents, query)
    ranked = sorted(
        (i for i in documents if expected[i] > 0 and i not in excluded),
        key=lambda i: (-expected[i], i),
    )
    scores = index.score(1, query, k, excluded)
    hits = scores.top(k, excluded)
    assert [h.id for h in hits] == ranked[:k]
    assert [h.score for h in hits] == pytest.approx([expected[i] for i in ranked[:k]])
    assert scores.of(list(range(60))) == pytest.approx(expected)


def test_a_snapshot_restores_the_same_scores_and_takes_later_changes() -> None:
    texts = {
        i: f"{w} {WORDS[(i * 7) % len(WORDS)]} {WORDS[i % 3]}" for i, w in enumerate(WORDS * 3)
    }
    index = build(texts)
    index.remove(1, [0, 5, 11])
    index.add(1, [3], ["violin violin 花生"])
    data = index.snapshot(1)
    assert data is not None and index.snapshot(2) is None
    copy = LexicalIndex()
    assert copy.restore(7, data)
    weights = {"violin": 1.0, "red": 0.3, "花生": 1.0, "lake": 0.24}
    assert copy.list_ids(7) == index.list_ids(1)
    assert copy.score(7, weights, 30).top(30) == index.score(1, weights, 30).top(30)
    assert copy.fingerprint(7, 3) == index.fingerprint(1, 3)
    for each in (copy, index):  # later changes land alike
        scope = 7 if each is copy else 1
        each.add(scope, [100, 3], ["red violin lake", "blue dog"])
        each.remove(scope, [4])
    assert copy.search(7, "violin lake dog", 30) == index.search(1, "violin lake dog", 30)
    damaged = bytearray(data)
    damaged[-5] ^= 1
    assert not LexicalIndex().restore(1, bytes(damaged))
    assert not LexicalIndex().restore(1, b"not a snapshot")


def test_a_document_is_mostly_cjk_when_half_its_letters_are() -> None:
    index = LexicalIndex()
    texts = ["我对猕猴桃过敏。", "I am allergic to peanuts. 我对花生过敏。", "I like tea."]
    index.add(1, [1, 2, 3], texts)
    assert [index.is_mostly_cjk(1, doc) for doc in (1, 2, 3, 4)] == [True, False, False, False]
    # Asked again after a document is replaced or removed: the answer of what it is now.
    index.add(1, [1, 3], ["I am allergic to kiwis.", "我喜欢喝茶。"])
    index.remove(1, [2])
    assert [index.is_mostly_cjk(1, doc) for doc in (1, 2, 3)] == [False, False, True]


def test_a_text_is_mostly_cjk_when_half_its_letters_are() -> None:
    assert is_mostly_cjk("我有什么过敏的食物吗？")
    assert is_mostly_cjk("我昨天去了一趟Costco")  # 7 of 13 letters
    assert not is_mostly_cjk("我昨天去了Costco")  # 5 of 11
    assert not is_mostly_cjk("What am I allergic to?")
    assert not is_mostly_cjk("2026-01-05 ?!")


def test_a_related_word_counts_at_most_as_much_as_the_asked_word() -> None:
    """In a small store every turn may say the asked word (its idf is low): a rare word
    related to it is weighed down by their idf ratio, so it cannot outweigh it."""
    index = LexicalIndex()
    texts = ["I am allergic to peanuts", "no peanuts please", "peanuts again", "some cheese"]
    index.add(1, [1, 2, 3, 4], texts)

    def idf(df: int) -> float:
        return math.log(1 + (4 - df + 0.5) / (df + 0.5))

    capped = index.query_weights(1, "peanut", {"chees": 0.3}, sources={"chees": "peanut"})
    assert capped == pytest.approx({"peanut": 1.0, "chees": 0.3 * idf(3) / idf(1)})
    # "peanuts again" is the shortest turn with the word; "some cheese" comes last.
    assert [hit.id for hit in index.score(1, capped, 4).top(4)] == [3, 1, 2, 4]
    # Without its source the related word keeps its weight, and its turn comes first.
    plain = index.query_weights(1, "peanut", {"chees": 0.3})
    assert plain == {"peanut": 1.0, "chees": 0.3}
    assert [hit.id for hit in index.score(1, plain, 4).top(4)] == [4, 3, 1, 2]


def snapshot_holds(index: LexicalIndex, term: str) -> bool:
    """Whether the scope's snapshot holds a term (numpy writes strings as UTF-32)."""
    return term.encode("utf-32-le") in (index.snapshot(1) or b"")


def test_compacting_forgets_the_terms_of_removed_documents_only() -> None:
    index = LexicalIndex()
    index.add(1, [1, 2, 3], ["red violin lake", "blue violin", "locker code zq7x"])
    index.remove(1, [3])
    before = index.search(1, "violin lake blue", 10)
    assert snapshot_holds(index, "zq7x")  # a removed document's terms stay held
    assert index.compact(1) == {"red", "violin", "lake", "blue"}
    assert not snapshot_holds(index, "zq7x") and not snapshot_holds(index, "locker")
    assert index.search(1, "violin lake blue", 10) == before
    assert index.search(1, "locker", 10) == []
    index.add(1, [4], ["violin locker"])  # new terms after the renumbering
    assert [hit.id for hit in index.search(1, "locker", 10)] == [4]
    assert index.fingerprint(1, 2) == index.fingerprint(1, 2) != frozenset()
    copy = LexicalIndex()
    assert copy.restore(1, index.snapshot(1) or b"")
    assert copy.search(1, "violin lake blue locker", 10) == index.search(
        1, "violin lake blue locker", 10
    )
    assert index.compact(2) == set()
