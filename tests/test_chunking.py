"""Chunking: token counts for English and Chinese, headings, paragraphs, overlap."""

from __future__ import annotations

import pytest

from retrieval.knowledge.chunking import (
    MAX_HEADING_PATH_CHARS,
    Chunk,
    Chunker,
    count_tokens,
    sections,
)


def test_token_counts_for_english_and_chinese() -> None:
    assert count_tokens("hello world") == 4  # two words of 5 letters: 2 tokens each
    assert count_tokens("a cat, 42.") == 5
    assert count_tokens("我对花生过敏。") == 7
    assert count_tokens("Tokyo 東京 ok") == 5


def test_sections_follow_headings_but_not_inside_code_fences() -> None:
    text = "intro\n# A\none\n## B\ntwo\n```\n# not a heading\n```\n# C\nthree"
    assert list(sections(text, markdown=True)) == [
        ("", "intro"),
        ("A", "one"),
        ("A > B", "two\n```\n# not a heading\n```"),
        ("C", "three"),
    ]
    assert list(sections("# A\nx", markdown=False)) == [("", "# A\nx")]


def test_paragraphs_are_packed_whole_and_chunks_overlap() -> None:
    text = "one two three.\n\nfour five six.\n\nseven eight nine ten eleven twelve."
    assert Chunker(max_tokens=9, overlap_tokens=2).split(text, markdown=False) == [
        Chunk(0, "one two three.\n\nfour five six.", 9, ""),
        # The last paragraph (11 tokens) must be cut: it starts after the overlap.
        Chunk(1, "six.\n\nseven eight nine ten", 8, ""),
        Chunk(2, "nine ten eleven twelve.", 7, ""),
    ]
    # A paragraph that fits a chunk of its own is not cut for the overlap.
    assert Chunker(max_tokens=9, overlap_tokens=2).split(
        "one two three four.\n\nfive six seven eight nine.", markdown=False
    ) == [
        Chunk(0, "one two three four.", 6, ""),
        Chunk(1, "five six seven eight nine.", 8, ""),
    ]


def test_chinese_text_is_cut_by_characters_with_overlap() -> None:
    chunks = Chunker(max_tokens=6, overlap_tokens=2).split(
        "# 说明\n一二三四五六七八九十", markdown=True
    )
    assert [(c.text, c.heading_path) for c in chunks] == [
        ("一二三四五六", "说明"),
        ("五六七八九十", "说明"),
    ]


def test_headings_alone_make_no_chunks() -> None:
    assert Chunker(10, 2).split("# A\n\n## B\n", markdown=True) == []


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="overlap_tokens < max_tokens"):
        Chunker(max_tokens=4, overlap_tokens=4)


def test_a_heading_line_of_many_hashes_is_read_in_linear_time() -> None:
    # Quadratic before: the lazy title rescanned the rest of the line at each character.
    line = "# " + "# " * 15000 + "x"
    assert list(sections(line + "\n\nbody", markdown=True)) == [
        ("", ""),
        ("# " * (MAX_HEADING_PATH_CHARS // 2), "\nbody"),
    ]


@pytest.mark.parametrize(
    ("line", "title"),
    [
        ("## Install ##", "Install"),
        ("# #", "#"),
        ("#  ", ""),
        ("# ", None),
        ("####### x", None),
        ("#x", None),
        ("### a # b \t#", "a # b"),
    ],
)
def test_headings_read_as_before(line: str, title: str | None) -> None:
    found = list(sections(line + "\nbody", markdown=True))
    if title is None:
        assert found == [("", line + "\nbody")]
    else:
        assert found == [("", ""), (title, "body")]
