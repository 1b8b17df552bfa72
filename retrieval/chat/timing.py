"""Where a chat turn spends its time, stage by stage, measured with `time.perf_counter`.

The retrieval layer only measures; the app decides what to publish (Prometheus
histograms, and spans of the stages, which `stage` hands to the app's observer), so
nothing here knows about metrics or tracing libraries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from retrieval.stages import Stage, StageValue, stage


@dataclass(frozen=True, slots=True)
class TurnTimings:
    """Seconds spent in each stage of one chat turn.

    Embedding runs after reading the session and its window (it needs the window's
    turns for the message's dense text), so `embed_s` is the embedder's time.
    `search_s` covers the turn and knowledge searches and reading their rows;
    `assemble_s` is the rest of building the context (pinned facts, keeping the window
    within budget, which may summarise, the prompt and its tokens). `ttft_s` runs from
    handing the prompt to the engine to its first text (None when the reply has no
    text); `generation_s` from handing the prompt to the engine's last event, so it
    includes `ttft_s`. `total_s` runs from admitting the turn (waiting for the session's
    lock included) to its result, storing and indexing both messages included.
    """

    embed_s: float
    search_s: float
    assemble_s: float
    ttft_s: float | None
    generation_s: float
    total_s: float


class StageClock:
    """Adds up the seconds spent in named stages of one turn; started when made."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, **values: StageValue) -> Iterator[Stage]:
        """Time the stage `name`, which the app's observer watches too."""
        start = time.perf_counter()
        try:
            with stage(name, **values) as observed:
                yield observed
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start

    def mark_once(self, name: str, since: float) -> None:
        """Record the seconds from `since` to now under `name`, unless already recorded."""
        if name not in self._seconds:
            self._seconds[name] = time.perf_counter() - since

    @property
    def started(self) -> float:
        """When the clock was made (`time.perf_counter`): a turn's admission."""
        return self._started

    def seconds(self, name: str) -> float:
        return self._seconds.get(name, 0.0)

    def seconds_or_none(self, name: str) -> float | None:
        return self._seconds.get(name)

    def timings(self) -> TurnTimings:
        """The turn's timings as of now; `context` is the whole of search and assembly."""
        search = self.seconds("search")
        return TurnTimings(
            embed_s=self.seconds("embed"),
            search_s=search,
            assemble_s=max(0.0, self.seconds("context") - search),
            ttft_s=self._seconds.get("time_to_first_token"),
            generation_s=self.seconds("generation"),
            total_s=time.perf_counter() - self._started,
        )
