"""How much of a session's previous prompt its next one reuses, in tokens: what a prefix
cache can reuse at best. Kept per session in this process, for the most recent ones."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from retrieval.prompt.report import shared_prefix

SESSIONS_KEPT = 1024


class PrefixTracker:
    def __init__(self, sessions_kept: int = SESSIONS_KEPT) -> None:
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()
        self._kept = sessions_kept

    def reuse(self, session_id: str, tokens: Sequence[int]) -> int | None:
        """Leading tokens shared with the session's previous prompt (None: none known)."""
        previous = self._prompts.get(session_id)
        return None if previous is None else shared_prefix(previous, tokens)

    def remember(self, session_id: str, tokens: Sequence[int]) -> None:
        """The session's latest prompt, that its next is measured against."""
        self._prompts[session_id] = list(tokens)
        self._prompts.move_to_end(session_id)
        while len(self._prompts) > self._kept:
            self._prompts.popitem(last=False)

    def forget(self, session_id: str) -> None:
        self._prompts.pop(session_id, None)
