"""Text rules shared by every part that takes text from clients.

`normalise` is applied once, where text enters the service (request bodies, form fields,
MCP tool arguments); everything stored from clients has been through it, so a reader of
a stored row, a prompt and a search index see the same characters.
"""

from __future__ import annotations

import re
import unicodedata

# Whitespace as JSON Schema patterns (ECMA-262 `\s`) define it, so that the documented
# pattern and this check agree on what counts as blank.
WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
# Characters that show nothing: zero-width spaces and joiners, direction marks and
# embeddings, the soft hyphen, variation selectors, Hangul fillers, interlinear
# annotation marks, musical formatting marks, tag characters and the blank Braille
# pattern. Text made only of these and whitespace is blank. Every character `normalise`
# may drop is among them, so text with a visible character keeps one once normalised.
INVISIBLE = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\u2800\u3164\ufe00-\ufe0f\uffa0\ufff9-\ufffb"
    "\U0001d173-\U0001d17a\U000e0000-\U000e007f\U000e0100-\U000e01ef"
)
_BLANK = re.compile(f"^[{WHITESPACE}{INVISIBLE}]*\\Z")
# A non-blank character, as the API documents it (a JSON Schema pattern).
VISIBLE_PATTERN = f"[^{WHITESPACE}{INVISIBLE}]"

# Scripts written without spaces between words: Hiragana, Katakana, CJK ideographs
# (extension A and the main block), Hangul syllables and compatibility ideographs.
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# Matches at a character of those scripts.
CJK_CHAR = re.compile(f"[{CJK}]")
# Within a line, a sentence ends at CJK end punctuation, at . ! ? ; followed by a space
# (not "3.5" or "e.g.x") or at an ellipsis: a line's sentences are `SENTENCE_END.split`.
SENTENCE_END = re.compile(r"(?<=[。！？；…])|(?<=[.!?;])\s+")

# Dropped wherever they are: direction marks, embeddings, overrides and isolates; zero-width
# space, word joiner and the invisible operators; the byte order mark; the soft hyphen;
# the deprecated format characters U+206A-U+206F; interlinear annotation marks; musical
# formatting marks.
_ALWAYS_DROPPED = (
    "\u00ad\u061c\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff"
    "\ufff9-\ufffb\U0001d173-\U0001d17a"
)
_TAG = "\U000e0000-\U000e007f"
# An emoji tag sequence (the flags of Scotland, Wales, England, and other subdivisions):
# the black flag, two to seven tag letters or digits, the cancel tag.
_BLACK_FLAG = "\U0001f3f4"
_FLAG = f"{_BLACK_FLAG}[\U000e0030-\U000e0039\U000e0061-\U000e007a]{{2,7}}\U000e007f"
_SELECTOR = "\ufe00-\ufe0f\U000e0100-\U000e01ef"
_JOINER = "\u200c\u200d"
# The characters the rules below may drop. Astral ones as two ranges (each range in a
# class costs a comparison per character scanned): the unassigned U+E0080-U+E00FF
# between the tags and the selectors are looked at too, and kept.
# No `+`: a repeat costs more per character scanned than the class alone.
_SUSPECT = re.compile(
    "[\u00ad\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufe00-\ufe0f"
    "\ufeff\ufff9-\ufffb\U0001d173-\U0001d17a\U000e0000-\U000e01ef]"
)
# Fewer runs of such characters than one in this many characters: each is cleaned where
# it is.
_SPARSE = 32
_DROPPED = re.compile(f"[{_ALWAYS_DROPPED}]")
_TAGS = re.compile(f"[{_TAG}]")
_FLAGS = re.compile(f"({_FLAG})")
# A visible character: not whitespace, not invisible, not a control character.
_VISIBLE = f"[^{WHITESPACE}{INVISIBLE}\\x00-\\x1f\\x7f-\\x9f]"
# A joiner not between two visible characters (a kept selector counts with the character
# it selects: "heart, VS16, ZWJ, fire"), and a selector not right after a visible one.
# The character first, then fixed-width look-arounds: linear, no callbacks, all in C.
_STRAY_JOINER = re.compile(
    f"[{_JOINER}](?:(?<!{_VISIBLE}.)(?<!{_VISIBLE}[{_SELECTOR}].)|(?!{_VISIBLE}))"
)
_STRAY_SELECTOR = re.compile(f"[{_SELECTOR}](?<!{_VISIBLE}.)")
# Tag characters that stand for printable ASCII (U+E0020 is a space, U+E0041 an "A").
_TAG_LETTERS = re.compile("[\U000e0020-\U000e007e]")
_TAG_TO_ASCII = {code: code - 0xE0000 for code in range(0xE0020, 0xE007F)}


def normalise(text: str) -> str:
    """Text as the service keeps it: what a reader sees, nothing hidden, in NFC.

    - Tag characters (U+E0000-U+E007F) go, except in an emoji tag sequence (a subdivision
      flag: U+1F3F4, two to seven tag letters or digits, U+E007F). They show nothing, yet
      a model reads U+E0020-U+E007E as ASCII, so they can carry words no reader sees.
    - Bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C),
      zero-width space, word joiner and invisible operators (U+200B, U+2060-U+2064), the
      byte order mark, the soft hyphen, the deprecated format characters U+206A-U+206F,
      interlinear annotation (U+FFF9-U+FFFB) and musical formatting (U+1D173-U+1D17A)
      go wherever they are.
    - A variation selector (U+FE00-U+FE0F, U+E0100-U+E01EF) stays only right after a
      visible character (emoji presentation, ideographic variation sequences): one
      selector per character; runs of them, which can encode bytes, go.
    - A zero-width joiner or non-joiner stays only between two visible characters (or
      after a kept selector): emoji sequences, Indic and Persian text.
    - The result is in NFC.

    Everything else is kept, other format characters of scripts included (Arabic number
    signs, Egyptian hieroglyph and shorthand format controls, Mongolian variation
    selectors, the combining grapheme joiner, Hangul fillers). Idempotent and linear:
    ASCII text (always NFC, with none of these characters) is returned as it is, other
    text costs one scan unless it has such characters; a few are cleaned where they are,
    many by one regular-expression pass per rule (no callbacks, all in C).
    """
    if text.isascii():
        return text
    runs = _runs(text)
    if runs is None:
        text = _cleaned(text)
    elif runs:
        text = _cleaned_runs(text, runs)
    return unicodedata.normalize("NFC", text)


def _runs(text: str) -> list[tuple[int, int]] | None:
    """Where the runs of characters the rules may drop are, or None for more runs than
    one in `_SPARSE` characters (then whole-text passes are quicker)."""
    runs: list[tuple[int, int]] = []
    limit = len(text) // _SPARSE
    for match in _SUSPECT.finditer(text):
        start, end = match.span()
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], end)
        elif len(runs) == limit:
            return None
        else:
            runs.append((start, end))
    return runs


def _cleaned_runs(text: str, runs: list[tuple[int, int]]) -> str:
    """Each run of such characters cleaned with the character on either side, which is
    all the context the rules read (and a character that always stays): the rest of the
    text is not scanned again."""
    pieces: list[str] = []
    done = 0
    for start, end in runs:
        before, after = text[start - 1 : start], text[end : end + 1]
        window = _cleaned(before + text[start:end] + after)
        pieces.append(text[done:start])
        pieces.append(window[len(before) : len(window) - len(after)])
        done = end
    pieces.append(text[done:])
    return "".join(pieces)


def _cleaned(text: str) -> str:
    """The dropping rules of `normalise`, one pass each over the whole text."""
    text = _DROPPED.sub("", text)
    if _BLACK_FLAG in text:
        pieces = _FLAGS.split(text)  # flags at the odd places
        text = "".join(p if i % 2 else _TAGS.sub("", p) for i, p in enumerate(pieces))
    else:
        text = _TAGS.sub("", text)
    # Selectors after joiners: a joiner dropped may leave a selector after a visible
    # character, never the other way round, so one pass of each is a fixed point.
    return _STRAY_SELECTOR.sub("", _STRAY_JOINER.sub("", text))


def has_tag_letters(text: str) -> bool:
    """Whether the text has a tag character that stands for an ASCII character."""
    return not text.isascii() and _TAG_LETTERS.search(text) is not None


def reveal_tags(text: str) -> str:
    """The text with each tag character U+E0020-U+E007E read as the ASCII character it
    stands for, as a model reading the text would."""
    if not has_tag_letters(text):
        return text
    return text.translate(_TAG_TO_ASCII)


_LETTER = re.compile(r"[^\W\d_]")


def is_mostly_cjk(text: str) -> bool:
    """Whether at least half of a text's letters are of the CJK scripts above."""
    letters = _LETTER.findall(text)
    return bool(letters) and 2 * sum(1 for c in letters if CJK_CHAR.match(c)) >= len(letters)


def is_blank(text: str) -> bool:
    return _BLANK.match(text) is not None
