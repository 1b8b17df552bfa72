"""The question of a long message: what a chatty message actually asks.

"Ugh, what a week, the weather has been awful... anyway, is there any food I should
avoid?" searched as a whole finds the turns about the weather and work; what it asks is
its last question. `focus_of` finds that question where the message ends with it and
itself says that what came before was beside the point: a topic-shift marker
("anyway", "by the way", 对了, 话说, ...) in the message's last sentence, which ends with
a question mark (in English or Chinese punctuation); the focus is what follows the
marker. Without a marker the
whole message is the question: "I am going to Paris next week. What should I pack?"
leans on its first sentence, and a dialogue searched as a whole (MADial-Bench's queries)
is often about something other than its last question (bench/RESULTS.md: a focus
taken from every message's last question lost recall there).

The search then takes the focus alone (`retrieval.search.memory.searched_text`): weighed
beside the whole message, at half or a quarter of its terms' weight, the small talk
still outvoted it where it repeats a stored turn's words (tests/test_new_user_recall.py).
A question that leans on its preface ("my son turns ten... anyway, what should I get
him?") loses that preface: the marker says it was beside the point.
"""

from __future__ import annotations

import re

# A sentence ends at . ! ? (and their CJK forms), an ellipsis or a line break.
_SENTENCE_END = re.compile(r"[.!?。！？…]+|\n")
_QUESTION_MARK = re.compile(r"[?？]")
# Topic-shift markers: what follows them is what the message is about.
_MARKERS = re.compile(
    r"\b(?:anyway|anyhow|by the way|btw|oh and|so tell me|quick question)\b|"
    r"对了|话说|顺便问一下|顺便问下|顺便问|顺便说一下|另外|说起来|言归正传",
    re.IGNORECASE,
)
# What may follow the question at the end of a message: closing quotes and brackets.
_CLOSING = re.compile(r"[\s\"'”’)）」』]*")
_LEADING = re.compile(r"^[\s,，、:：;；\-—\"'“‘「『(（]+")
# A focus shorter than this says too little to search with ("Why?", "真的？").
MIN_FOCUS_CHARS = 6


def focus_of(message: str) -> str | None:
    """The question a message ends on after a topic-shift marker (see the module
    docstring), or None."""
    marks = list(_QUESTION_MARK.finditer(message))
    if not marks or not _CLOSING.fullmatch(message, marks[-1].end()):
        return None
    end = marks[-1].end()
    start = 0
    for boundary in _SENTENCE_END.finditer(message, 0, marks[-1].start()):
        start = boundary.end()
    markers = list(_MARKERS.finditer(message, start, end))
    if not markers:
        return None
    focus = _LEADING.sub("", message[markers[-1].end() : end]).strip()
    if len(focus) < MIN_FOCUS_CHARS or focus == message.strip():
        return None
    return focus
