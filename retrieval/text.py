"""Text rules shared by every part that takes text from clients."""

from __future__ import annotations

import re

# Whitespace as JSON Schema patterns (ECMA-262 `\s`) define it, so that the documented
# pattern and this check agree on what counts as blank.
WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
# Characters that show nothing: zero-width spaces and joiners, direction marks and
# embeddings, the soft hyphen, variation selectors, Hangul fillers. Text made only of
# these and whitespace is blank.
INVISIBLE = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\u3164\ufe00-\ufe0f\uffa0"
)
_BLANK = re.compile(f"^[{WHITESPACE}{INVISIBLE}]*$")
# A non-blank character, as the API documents it (a JSON Schema pattern).
VISIBLE_PATTERN = f"[^{WHITESPACE}{INVISIBLE}]"

# Scripts written without spaces between words: Hiragana, Katakana, CJK ideographs
# (extension A and the main block), Hangul syllables and compatibility ideographs.
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# Matches at a character of those scripts.
CJK_CHAR = re.compile(f"[{CJK}]")


_LETTER = re.compile(r"[^\W\d_]")


def is_mostly_cjk(text: str) -> bool:
    """Whether at least half of a text's letters are of the CJK scripts above."""
    letters = _LETTER.findall(text)
    return bool(letters) and 2 * sum(1 for c in letters if CJK_CHAR.match(c)) >= len(letters)


def is_blank(text: str) -> bool:
    return _BLANK.match(text) is not None
