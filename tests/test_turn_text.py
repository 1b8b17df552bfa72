"""What is indexed for a turn: exact texts for each recipe, windows of the dense
pieces, and the recipe's tag."""

from __future__ import annotations

import datetime as dt

from retrieval.search.indexed_text import (
    TextRecipe,
    dense_pieces,
    dense_texts,
    indexed_text,
    split_windows,
)
from tests.records import turn as stored_turn

WHEN = dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.UTC)


def turn(seq: int, content: str, name: str | None = "Caroline", session: str = "s1", **extra):
    return stored_turn(seq, content, name=name, session_id=session, created_at=WHEN, **extra)


def test_raw_recipe_is_the_content_alone() -> None:
    recipe = TextRecipe()
    assert recipe.is_raw and recipe.tag() == "raw"
    assert indexed_text(recipe, turn(2, "Take a look", image_caption="a dog")) == "Take a look"


def test_full_recipe_adds_speaker_caption_date_and_previous_turns() -> None:
    recipe = TextRecipe(speaker=True, date=True, caption=True, previous=1)
    assert recipe.tag() == "speaker+date+caption+previous1"
    earlier = [turn(1, "What did you do?", name=None), turn(2, "Anything new?", name="Mel")]
    text = indexed_text(recipe, turn(3, "Take a look!", image_caption="a dog on a beach"), earlier)
    assert text == (
        "Caroline: Take a look! [image: a dog on a beach] (on 8 May 2023)\n"
        "(after Mel: Anything new?)"
    )


def test_previous_turns_come_from_the_same_session_only() -> None:
    recipe = TextRecipe(previous=2)
    turns = [turn(1, "one"), turn(2, "two"), turn(1, "other", session="s2"), turn(3, "三")]
    assert [texts[0] for texts in dense_texts(recipe, turns)] == [
        "one",
        "two\n(after Caroline: one)",
        "other",
        "三\n(after Caroline: one)\n(after Caroline: two)",
    ]


def test_windows_are_slices_of_the_text() -> None:
    text = "I went to the park yesterday with my sister and her dog Max who is sick now."
    assert split_windows(text, 8) == [
        "I went to the park yesterday with my",
        "sister and her dog Max who is sick",
        "now.",
    ]
    assert split_windows("  short turn ", 8) == ["short turn"]
    assert split_windows("", 8) == [""]


def test_a_cjk_character_counts_as_half_a_word() -> None:
    # 6 + 3 + 3 characters (6 words) and two full-width stops (a word each): 8 words.
    text = "我对花生过敏，请记住。我喜欢在周末去公园散步和看书"
    assert split_windows(text, 8) == ["我对花生过敏，请记住。我喜欢", "在周末去公园散步和看书"]
    assert split_windows("我对花生过敏", 8) == ["我对花生过敏"]


def test_windowed_recipe_renders_each_window_caption_and_context_as_pieces() -> None:
    recipe = TextRecipe(speaker=True, caption=True, previous=1, window=4)
    assert recipe.tag() == "speaker+caption+previous1+window4"
    turns = [
        turn(1, "Anything new?", name="Mel"),
        turn(2, "We adopted a puppy last week, look", image_caption="a dog"),
    ]
    assert dense_texts(recipe, turns) == [
        ["Mel: Anything new?"],
        [
            "Caroline: We adopted a puppy",
            "Caroline: last week, look",
            "Caroline: [image: a dog]",
            "(after Mel: Anything new?)",
        ],
    ]
    # Without a window the turn is one piece: its indexed text.
    plain = TextRecipe(speaker=True)
    assert dense_pieces(plain, turns[1]) == [indexed_text(plain, turns[1])]
