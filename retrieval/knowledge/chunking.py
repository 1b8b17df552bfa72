"""Splitting documents into passages of bounded size for embedding and retrieval.

Sizes are counted in approximate tokens, the same for every embedder: each CJK character
(Chinese, Japanese kana, Korean) is one token, as BERT-style tokenizers such as
all-MiniLM-L6-v2's split them; a run of other letters or digits is one token per 4
characters or part thereof (an English word is one or two word pieces); every other
non-space character is one token. This keeps chunks under the embedder's input limit
for English and Chinese alike without loading its tokenizer.

Chunks follow the document's structure: Markdown headings start new sections (their
path, "Guide > Install", travels with each chunk), paragraphs are packed whole while they
fit, and only a paragraph longer than a chunk is cut, at token boundaries. Consecutive
chunks of a section share `overlap_tokens` tokens, so a fact cut in two is whole in one,
except where dropping the overlap keeps the next paragraph whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from retrieval.text import CJK

_TOKEN = re.compile(rf"[{CJK}]|[^\W{CJK}]+|[^\s\w]", re.UNICODE)
_HEADING = re.compile(r"(#{1,6})([ \t]+)")
_FENCE = re.compile(r"^(```|~~~)")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
LATIN_CHARS_PER_TOKEN = 4
# A chunk's heading path is cut to this many characters (the size of its stored column):
# a heading is a line, and a line may be as long as the document.
MAX_HEADING_PATH_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Chunk:
    ordinal: int
    text: str
    token_count: int
    heading_path: str


@dataclass(frozen=True, slots=True)
class _Span:
    start: int
    end: int
    tokens: int


def _spans(text: str) -> list[_Span]:
    spans = []
    for match in _TOKEN.finditer(text):
        piece = match.group()
        is_word = piece[0].isalnum() and len(piece) > 1
        tokens = math.ceil(len(piece) / LATIN_CHARS_PER_TOKEN) if is_word else 1
        spans.append(_Span(match.start(), match.end(), tokens))
    return spans


def count_tokens(text: str) -> int:
    return sum(span.tokens for span in _spans(text))


def sections(text: str, *, markdown: bool) -> Iterator[tuple[str, str]]:
    """(heading path, body) of each section; plain text is one section without a path."""
    if not markdown:
        yield "", text
        return
    path: list[tuple[int, str]] = []
    body: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            in_fence = not in_fence
        heading = None if in_fence else _heading(line)
        if heading is None:
            body.append(line)
            continue
        yield _path_text(path), "\n".join(body)
        level, heading_title = heading
        path = [(lvl, title) for lvl, title in path if lvl < level]
        path.append((level, heading_title))
        body = []
    yield _path_text(path), "\n".join(body)


def _path_text(path: list[tuple[int, str]]) -> str:
    return " > ".join(title for _, title in path)[:MAX_HEADING_PATH_CHARS]


def _heading(line: str) -> tuple[int, str] | None:
    """(level, title) of a Markdown heading line ("## Install ##"), or None.

    The trailing blanks and #s are cut with `str.rstrip`, in linear time: a lazy title
    group before `[ \t#]*$` rescans the rest of the line at each character it takes,
    quadratic on a long line of "# # # ...". Same results: the title is all after the
    blanks up to its trailing blanks and #s, or its first character where that leaves
    nothing ("# #" is titled "#"); a line of #s and two or more blanks is an empty
    heading, one with a single blank none."""
    match = _HEADING.match(line)
    if match is None:
        return None
    rest = line[match.end() :]
    if not rest:
        return (len(match.group(1)), "") if len(match.group(2)) > 1 else None
    return len(match.group(1)), (rest.rstrip(" \t#") or rest[0]).strip()


class Chunker:
    def __init__(self, max_tokens: int, overlap_tokens: int) -> None:
        if max_tokens < 1 or not 0 <= overlap_tokens < max_tokens:
            raise ValueError("need max_tokens >= 1 and 0 <= overlap_tokens < max_tokens")
        self._max = max_tokens
        self._overlap = overlap_tokens

    def split(self, text: str, *, markdown: bool) -> list[Chunk]:
        chunks: list[Chunk] = []
        for heading_path, body in sections(text, markdown=markdown):
            for piece in self._pack(body):
                chunks.append(Chunk(len(chunks), piece, count_tokens(piece), heading_path))
        return chunks

    def _pack(self, body: str) -> Iterator[str]:
        """Whole paragraphs while they fit; a new chunk starts with the previous one's tail."""
        spans: list[_Span] = []
        for paragraph in _paragraphs(body):
            pieces = _spans(paragraph[1])
            if not pieces:
                continue
            offset = paragraph[0]
            para = [_Span(s.start + offset, s.end + offset, s.tokens) for s in pieces]
            if spans and _total(spans) + _total(para) > self._max:
                yield _text(body, spans)
                spans = self._tail(spans)
                # The overlap gives way where that keeps a paragraph whole.
                if _total(spans) + _total(para) > self._max >= _total(para):
                    spans = []
            for span in para:
                if spans and _total(spans) + span.tokens > self._max:
                    yield _text(body, spans)
                    spans = self._tail(spans)
                spans.append(span)
        if spans:
            yield _text(body, spans)

    def _tail(self, spans: list[_Span]) -> list[_Span]:
        tail: list[_Span] = []
        used = 0
        for span in reversed(spans):
            if used + span.tokens > self._overlap:
                break
            tail.append(span)
            used += span.tokens
        tail.reverse()
        return tail


def _paragraphs(body: str) -> Iterator[tuple[int, str]]:
    start = 0
    for match in _PARAGRAPH_BREAK.finditer(body):
        yield start, body[start : match.start()]
        start = match.end()
    yield start, body[start:]


def _total(spans: list[_Span]) -> int:
    return sum(span.tokens for span in spans)


def _text(body: str, spans: list[_Span]) -> str:
    return body[spans[0].start : spans[-1].end]
