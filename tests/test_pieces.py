"""A long query searched by its sentences as well as whole (retrieval/search/pieces.py):
how a query is cut, and the ranking of a dense list by the combined score."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval.indexes.faiss import FaissIndex
from retrieval.search.pieces import MAX_PIECES, PieceScorer, QueryVectors, combined, query_pieces


@pytest.mark.parametrize(
    ("query", "pieces"),
    [
        ("What am I allergic to?", []),
        ("我对什么过敏？", []),
        # Two sentences are searched as one.
        ("I am going to Paris next week. What should I pack?", []),
        ("唉，今天又加班到很晚。对了，我有没有什么不能吃的水果？", []),
        (
            "I am going to Paris. It is my first time! What should I pack?",
            ["I am going to Paris.", "It is my first time!", "What should I pack?"],
        ),
        (
            "唉，今天又加班到很晚。好累！对了，我有没有什么不能吃的水果？",
            ["唉，今天又加班到很晚。", "好累！", "对了，我有没有什么不能吃的水果？"],
        ),
        # A transcript: speaker labels, quotes and tag-only lines are not what is said.
        (
            '<BOD>\n<Bart>:"I found a great pizza place!"\n<Assistant>:"Really? Which one?"\n',
            ["I found a great pizza place!", "Really?", "Which one?"],
        ),
        (
            "User: hi there\nAssistant: hello! How are you?",
            ["hi there", "hello!", "How are you?"],
        ),
        (
            "[Lisa]：我养了一只猫。\n[Assistant]：它叫什么名字？\n[Lisa]：咪咪。",
            ["我养了一只猫。", "它叫什么名字？", "咪咪。"],
        ),
        # Not sentence ends: a decimal point, a dot inside a word; a sentence said twice
        # is one piece; punctuation alone is none.
        ("Version 3.5 is out... Is it? Is it? Yes.", ["Version 3.5 is out...", "Is it?", "Yes."]),
        ("See e.g.this one. — ...", []),
    ],
)
def test_a_query_is_cut_into_its_sentences(query: str, pieces: list[str]) -> None:
    assert query_pieces(query) == pieces


def test_a_long_query_keeps_its_last_sentences() -> None:
    sentences = [f"Sentence number {i} is here." for i in range(MAX_PIECES + 4)]
    assert query_pieces(" ".join(sentences)) == sentences[-MAX_PIECES:]


def test_the_combined_score_adds_the_best_sentence() -> None:
    whole = {1: 0.5, 2: 0.6}
    pieces = [{1: 0.9, 2: 0.2}, {1: 0.1, 2: 0.4}]
    assert combined(whole, pieces, 1.0) == pytest.approx({1: 1.4, 2: 1.0})
    assert combined(whole, pieces, 0.5) == pytest.approx({1: 0.95, 2: 0.8})


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


async def test_a_memory_near_one_sentence_outranks_one_near_the_blend(tmp_path: Path) -> None:
    """Memory 10 answers the query's first sentence, 11 its second, 12 sits between them
    (nearest the whole query's vector), 13 is about nothing asked."""
    index = FaissIndex(tmp_path, 3)
    memories = {10: unit(1, 0, 0), 11: unit(0, 1, 0), 12: unit(1, 1, 0.6), 13: unit(0, 0, 1)}
    await index.add(7, list(memories), np.stack(list(memories.values())))
    whole = unit(1, 0.9, 0)
    sentences = np.stack([unit(1, 0.05, 0), unit(0.05, 1, 0)])

    by_whole = await index.search(7, whole, 4)
    assert [hit.id for hit in by_whole] == [12, 10, 11, 13]

    scorer = PieceScorer(index, 7, whole, sentences, weight=1.0)
    found = await scorer.search(4, exclude=())
    assert [hit.id for hit in found] == [10, 11, 12, 13]
    expected = {
        i: float(whole @ v) + max(float(s @ v) for s in sentences) for i, v in memories.items()
    }
    assert {hit.id: hit.score for hit in found} == pytest.approx(expected)
    # The fusion's exact scores are the same combined scores, for any id held.
    assert await scorer.scores({13, 99}) == pytest.approx({13: expected[13]})
    assert [hit.id for hit in await scorer.search(4, exclude={10})] == [11, 12, 13]


async def test_query_vectors_embed_only_what_they_do_not_hold() -> None:
    calls: list[list[str]] = []

    async def embed(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        return np.stack([unit(len(t), 1.0, 0.0) for t in texts])

    vectors = QueryVectors(size=3)
    vectors.put(["a"], np.stack([unit(1, 1, 0)]))
    got = await vectors.of(["a", "bb", "bb", "ccc"], embed)
    assert calls == [["bb", "ccc"]]
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got[1], got[2])
    assert vectors.missing(["a", "dddd"]) == ["dddd"]
    await vectors.of(["dddd"], embed)  # the least recently used ("a") goes
    assert vectors.missing(["a", "bb", "ccc", "dddd"]) == ["a"]
    assert (await vectors.of([], embed)).shape[0] == 0
