"""Related-word query expansion: which of the user's own words join the query, at what
weight, and that the lexical search then finds a turn that never says the asked word."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from retrieval.search.expansion import NeighbourConfig, WordNeighbours
from retrieval.search.lexical import LexicalIndex


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


# Cosine with "instrument": violin 0.8, guitar 0.6, instruments 0.99 (same term), piano 0.4.
TABLE = {
    "instrument": unit(1, 0, 0, 0),
    "instruments": unit(0.99, 0.141, 0, 0),
    "violin": unit(0.8, 0.6, 0, 0),
    "guitar": unit(0.6, 0.8, 0, 0),
    "piano": unit(0.4, 0, 0.9165, 0),
}
OTHER = unit(0, 0, 0, 1)


class TableEmbedder:
    """Word vectors from a table (anything else: one far direction); counts what it embeds."""

    def __init__(self) -> None:
        self.embedded: list[list[str]] = []

    async def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.embedded.append(list(texts))
        return np.stack([TABLE.get(text, OTHER) for text in texts])


TURNS = [
    "I practise the violin every day",
    "Bought a new guitar",
    "My piano is old",
    "So many instruments here",
    "The weather is nice",
]


def neighbours(count: int = 3, minimum: float = 0.5) -> WordNeighbours:
    found = WordNeighbours(NeighbourConfig(count, minimum, 0.3))
    found.add(1, TURNS)
    return found


async def test_query_words_bring_the_nearest_words_of_the_users_vocabulary() -> None:
    embed = TableEmbedder()
    related = await neighbours().expand(1, "Which instrument?", embed)
    # "instruments" shares the asked word's term; piano is below 0.5; weights 0.3 x cosine.
    assert related == pytest.approx({"violin": 0.24, "guitar": 0.18})
    assert await neighbours(count=1).expand(1, "Which instrument?", embed) == pytest.approx(
        {"violin": 0.24}
    )
    assert await neighbours(minimum=0.3).expand(1, "instrument", embed) == pytest.approx(
        {"violin": 0.24, "guitar": 0.18, "piano": 0.12}, abs=1e-5
    )


async def test_the_vocabulary_is_embedded_once_and_query_words_it_holds_are_not() -> None:
    embed = TableEmbedder()
    found = neighbours()
    await found.expand(1, "instrument", embed)
    vocabulary, asked = embed.embedded
    assert sorted(vocabulary) == sorted(
        [
            "practise",
            "violin",
            "every",
            "day",
            "bought",
            "new",
            "guitar",
            "piano",
            "old",
            "many",
            "instruments",
            "weather",
            "nice",
        ]
    )
    assert asked == ["instrument"]
    # Asked words the user has said are looked up, not embedded; new turns' words are
    # embedded at the next search, alone.
    await found.expand(1, "violin guitar", embed)
    assert len(embed.embedded) == 2
    found.add(1, ["A cello"])
    await found.expand(1, "violin", embed)
    assert embed.embedded[2:] == [["cello"]]


async def test_a_word_asked_again_finds_words_said_since_without_being_embedded_again() -> None:
    embed = TableEmbedder()
    found = neighbours(count=1)
    assert await found.expand(1, "instrument", embed) == pytest.approx({"violin": 0.24})
    # A word nearer to "instrument" than the violin arrives with a later turn.
    TABLE["viola"] = unit(0.95, 0.3122, 0, 0)
    try:
        found.add(1, ["My viola"])
        related = await found.expand(1, "instrument", embed)
    finally:
        del TABLE["viola"]
    assert related == pytest.approx({"viola": 0.3 * 0.95}, abs=1e-5)
    # The vocabulary, "instrument" once, then only the new word.
    assert embed.embedded[1:] == [["instrument"], ["viola"]]
    # The same nearest words as a fresh vocabulary of every turn, scanned in full.
    fresh = WordNeighbours(NeighbourConfig(3, 0.5, 0.3))
    fresh.add(1, [*TURNS, "My viola"])
    TABLE["viola"] = unit(0.95, 0.3122, 0, 0)
    try:
        again = neighbours(count=3)
        # "instrument" is a new word to the user, "violin" one of theirs.
        for query in ("instrument", "violin"):
            await again.expand(1, query, embed)
        again.add(1, ["My viola"])
        for query in ("instrument", "violin"):
            assert await again.expand(1, query, embed) == pytest.approx(
                await fresh.expand(1, query, embed)
            )
        assert "viola" in await again.expand(1, "violin", embed)
    finally:
        del TABLE["viola"]


async def test_words_embedded_with_a_query_are_not_embedded_again_when_said() -> None:
    embed = TableEmbedder()
    found = neighbours()
    await found.expand(1, "instrument", embed)
    # A message asks about a cello: its new word is embedded with it, as a query...
    assert found.words_to_embed(1, "A cello?") == ["cello"]
    found.give_vectors(1, ["cello"], await embed(["cello"]))
    await found.expand(1, "A cello?", embed)
    # ...then the message is stored: its words join the vocabulary without an embedding.
    calls = len(embed.embedded)
    found.add(1, ["A cello?"])
    await found.embed_pending(1, embed)
    assert len(embed.embedded) == calls
    assert found.num_embedded(1) == 14


async def test_scopes_are_apart_and_dropped_whole() -> None:
    embed = TableEmbedder()
    found = neighbours()
    assert await found.expand(2, "instrument", embed) == {}
    found.drop(1)
    assert found.num_words(1) == 0
    assert await found.expand(1, "instrument", embed) == {}
    off = NeighbourConfig(num_neighbours=0)
    assert await WordNeighbours(off).expand(1, "instrument", embed) == {}


async def test_related_words_let_bm25_find_a_turn_without_the_asked_word() -> None:
    lexical = LexicalIndex()
    lexical.add(1, [1, 2, 3, 4, 5], TURNS)
    assert [hit.id for hit in lexical.search(1, "Which instrument?", 10)] == [4]  # stemmed
    lexical.add(1, [4], ["So many things here"])
    assert lexical.search(1, "Which instrument?", 10) == []
    related = await neighbours().expand(1, "Which instrument?", TableEmbedder())
    hits = lexical.search(1, "Which instrument?", 10, extra_terms=related)
    assert [hit.id for hit in hits] == [1, 2]
    weights = lexical.query_weights(1, "Which instrument?", related)
    assert weights == pytest.approx({"instrument": 1.0, "violin": 0.24, "guitar": 0.18})
    assert lexical.score(1, weights).of([1, 2, 5, 99]) == pytest.approx(
        {1: hits[0].score, 2: hits[1].score, 5: 0.0}
    )


async def test_another_form_of_an_asked_word_counts_as_the_word() -> None:
    """The stemmer leaves "allergic" and "allergy" apart ("allerg", "allergi"): a near
    word whose term begins the asked word's (or the reverse) joins at full weight and
    leaves the related words their number; a near word of another stem does not."""
    table = {
        "allergy": unit(1, 0, 0, 0),
        "allergic": unit(0.9, 0.436, 0, 0),
        "peanuts": unit(0.6, 0.8, 0, 0),
        "snack": unit(0.55, 0, 0.835, 0),
        "alley": unit(0.7, 0, 0.7141, 0),
    }

    async def embed(texts: Sequence[str]) -> np.ndarray:
        return np.stack([table.get(text, OTHER) for text in texts])

    found = WordNeighbours(NeighbourConfig(1, 0.5, 0.3))
    found.add(1, ["I am allergic to peanuts", "What snack?", "Down the alley"])
    related = await found.expand(1, "food allergy", embed)
    # "alley" (0.7) is nearer than peanuts but of another stem: it is the one related word.
    assert related == pytest.approx({"allerg": 1.0, "alley": 0.21}, abs=1e-4)


async def test_words_whose_terms_no_turn_holds_are_forgotten() -> None:
    embed = TableEmbedder()
    found = neighbours(minimum=0.3)
    await found.embed_pending(1, embed)
    found.add(1, ["the violins again"])  # a word still to embed
    kept_terms = LexicalIndex()
    kept_terms.add(1, [1, 2], [TURNS[0], "violins piano"])
    found.keep_terms(1, kept_terms.compact(1))
    snapshot = found.snapshot(1)
    assert snapshot is not None
    words = ["day", "every", "piano", "practise", "violin", "violins"]
    assert sorted(snapshot["words"].tolist()) == words
    assert snapshot["matrix"].shape[0] == 5  # the embedded ones kept their vectors
    related = await found.expand(1, "instrument", embed)
    assert related == pytest.approx({"violin": 0.24, "piano": 0.12}, abs=1e-5)
