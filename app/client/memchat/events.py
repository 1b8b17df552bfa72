"""A streamed chat turn's Server-Sent Events, read line by line: `token` events, then one
`done` (the turn, as a plain turn's answer) or one `error` (problem details, raised)."""

from __future__ import annotations

import msgspec

from memchat.errors import error_for
from memchat.types import ProblemDetails, Token, Turn

_token = msgspec.json.Decoder(Token)
_turn = msgspec.json.Decoder(Turn)
_problem = msgspec.json.Decoder(ProblemDetails)


class EventReader:
    """Collects an event's `event:` and `data:` lines; a blank line ends the event."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> Token | Turn | None:
        """The event a blank line completes, or None. Raises the `error` event's
        exception (`memchat.errors.ServiceUnavailableError` for a failed engine)."""
        if line:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)
            return None
        event, data = self._event, "\n".join(self._data)
        self._event, self._data = "message", []
        if not data:
            return None
        if event == "token":
            return _token.decode(data)
        if event == "done":
            return _turn.decode(data)
        if event == "error":
            raise error_for(_problem.decode(data))
        return None
