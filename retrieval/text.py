"""Text rules shared by every part that takes text from clients."""

from __future__ import annotations

import re

# Whitespace as JSON Schema patterns (ECMA-262 `\s`) define it, so that the documented
# pattern and this check agree on what counts as blank.
WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_BLANK = re.compile(f"^[{WHITESPACE}]*$")


def is_blank(text: str) -> bool:
    return _BLANK.match(text) is not None
