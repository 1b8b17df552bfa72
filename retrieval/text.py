"""Text rules shared by every part that takes text from clients."""

from __future__ import annotations

import re

# Whitespace as JSON Schema patterns (ECMA-262 `\s`) define it, so that the documented
# pattern and this check agree on what counts as blank.
WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_BLANK = re.compile(f"^[{WHITESPACE}]*$")

# Scripts written without spaces between words: Hiragana, Katakana, CJK ideographs
# (extension A and the main block), Hangul syllables and compatibility ideographs.
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# Matches at a character of those scripts.
CJK_CHAR = re.compile(f"[{CJK}]")


def is_blank(text: str) -> bool:
    return _BLANK.match(text) is not None
