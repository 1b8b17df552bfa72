"""A long memory shown by the part of it that answers the message.

A past turn of several sentences is often found for one of them ("Wow, congrats! I went
to the support group yesterday. It was so powerful..." for "When did she go to the
support group?"); quoting it whole spends the memory budget on the rest. So a memory of
`min_sentences` sentences or more is shown as its sentences that share the message's
terms (the lexical index's terms: stemmed English words, Chinese characters and their
pairs): the best-matching one and every one that matches at least half as well, in
their order, each place where sentences are left out marked with `…` inside the quoted
text. A memory none of whose sentences shares a term (found by meaning alone, where a
cut could drop the answer) is shown whole, as is one the cut would not shorten by a
third.

The excerpt is plain text inside the memory's JSON quotes like the whole turn: a cut
adds no line, no role and no unquoted text, so nothing stored can forge an item.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from retrieval.search.lexical import tokenize
from retrieval.text import CJK_CHAR, SENTENCE_END
from retrieval.turns import SearchHit

CUT = "…"
# A memory shown cut keeps at most this share of its characters (else it is shown whole:
# the cut marks and what it saves are then not worth a reader's doubt).
MAX_KEPT_SHARE = 2 / 3
# Text that ends in a CJK character or CJK punctuation.
_CJK_END = re.compile(f"(?:{CJK_CHAR.pattern}|[\u3000-\u303f\uff00-\uffef])$")


def sentences(text: str) -> list[str]:
    """The sentences of `text` (each line's, as a long query's are cut:
    `retrieval.search.pieces`), each a slice of it without its surrounding space."""
    parts = (part.strip() for line in text.split("\n") for part in SENTENCE_END.split(line))
    return [part for part in parts if part]


def _weight(term: str) -> float:
    """A Chinese character alone says less than a word or a pair of characters."""
    return 0.5 if len(term) == 1 and CJK_CHAR.match(term) else 1.0


def excerpt(content: str, terms: frozenset[str], min_sentences: int) -> str | None:
    """The part of `content` to show for a message of `terms` (see the module docstring),
    or None where it is shown whole."""
    parts = sentences(content)
    if min_sentences <= 0 or len(parts) < min_sentences:
        return None
    scores = [sum(_weight(t) for t in terms.intersection(tokenize(part))) for part in parts]
    best = max(scores)
    if best < 1:
        return None
    kept = [i for i, score in enumerate(scores) if score >= max(1.0, best / 2)]
    if sum(len(parts[i]) for i in kept) > MAX_KEPT_SHARE * len(content):
        return None
    shown: list[str] = [] if kept[0] == 0 else [CUT]
    for position, index in enumerate(kept):
        if position and index > kept[position - 1] + 1:
            shown.append(CUT)
        shown.append(parts[index])
    if kept[-1] < len(parts) - 1:
        shown.append(CUT)
    return _joined(shown)


def _joined(parts: Sequence[str]) -> str:
    """Parts joined by a space, except next to Chinese text, written without spaces."""
    out = parts[0]
    for part in parts[1:]:
        cjk = CJK_CHAR.match(part[0]) or _CJK_END.search(out)
        out += part if cjk else f" {part}"
    return out


def with_excerpts(hits: Sequence[SearchHit], query: str, min_sentences: int) -> list[SearchHit]:
    """The hits, each long one with the excerpt the prompt shows for `query`."""
    terms = frozenset(tokenize(query)) if min_sentences > 0 else frozenset()
    if not terms:
        return list(hits)
    out: list[SearchHit] = []
    for hit in hits:
        shown = excerpt(hit.turn.content, terms, min_sentences)
        out.append(replace(hit, excerpt=shown) if shown is not None else hit)
    return out
