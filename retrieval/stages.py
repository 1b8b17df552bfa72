"""Named stages of the work this layer does, for whoever watches: the app traces them.

The retrieval layer only measures and names; the app decides what to publish and how
(`app.observability.tracing` turns each stage into a span). A stage is opened with
`stage(name, **values)` around the work it names and may `record` more values once
they are known (a count of hits, the tokens a reply took). Message text is handed over
apart, with `content`, so that the observer can leave it out, as it does by default.

The observer is a context variable, like the engine route (`engines.routing`): the app
sets it for each request and for the background tasks it starts, and stages nest as the
calls do. Unset, every stage is a shared no-op: nothing is recorded or allocated.
Stage names and value keys are plain words of this layer (`embed`, `num_hits`); the
observer maps them onto its own conventions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Protocol

StageValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


class Stage(Protocol):
    def record(self, **values: StageValue) -> None:
        """Values known once the work is done (counts, tokens)."""

    def content(self, role: str, text: str) -> None:
        """Message text of this stage (`role`: "user", "assistant"); the observer keeps
        it only where it was told to."""


class StageObserver(Protocol):
    def stage(self, name: str, values: Mapping[str, StageValue]) -> AbstractContextManager[Stage]:
        """Watch the stage `name` for as long as the returned context is open; an
        exception leaving it is the stage's failure."""


class _Unwatched:
    """The stage nobody watches."""

    def record(self, **values: StageValue) -> None:
        pass

    def content(self, role: str, text: str) -> None:
        pass

    def __enter__(self) -> _Unwatched:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNWATCHED = _Unwatched()


_observer: ContextVar[StageObserver | None] = ContextVar("stage_observer", default=None)


def stage(name: str, **values: StageValue) -> AbstractContextManager[Stage]:
    """The stage `name` of the current observer (a no-op without one)."""
    observer = _observer.get()
    if observer is None:
        return _UNWATCHED
    return observer.stage(name, values)


@contextmanager
def observing(observer: StageObserver) -> Iterator[None]:
    """`observer` watches the stages of this context, and of the tasks started from it,
    while this is open."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)
