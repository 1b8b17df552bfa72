"""What is indexed for a turn: exact texts for each recipe, and the recipe's tag."""

from __future__ import annotations

import datetime as dt

from retrieval.turn_text import TextRecipe, TurnText, indexed_text, indexed_texts

WHEN = dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.UTC)


def turn(seq: int, content: str, name: str | None = "Caroline", session: str = "s1", **extra):
    return TurnText(session, seq, "user", name, content, WHEN, **extra)


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
    assert indexed_texts(recipe, turns) == [
        "one",
        "two\n(after Caroline: one)",
        "other",
        "三\n(after Caroline: one)\n(after Caroline: two)",
    ]
