"""A stored turn as the admin page's inspector shows it: its report (kept with its reply)
joined with the rows it names, read now: the memories' and facts' own text, if still
stored.

The prompt's bar draws the report's section sizes in the order the prompt holds them
(the system message, the recent window, then the turn's own message with its context),
so that the cached prefix, a count of leading tokens, is marked where it ends; the
template's tokens, spread over every message, come last.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from retrieval.chat.turn_report import ReportedMemory, TurnReport, report_of_stored
from retrieval.facts.memory import FactMemory
from storage.facts import STATUSES
from storage.messages import MessageRepository
from storage.records import Fact, Turn

# (report field, label): the prompt's sections in the order the prompt holds them.
SECTIONS = (
    ("system", "System prompt"),
    ("facts", "Pinned facts"),
    ("summary", "Summary"),
    ("recent", "Recent window"),
    ("memories", "Memories"),
    ("knowledge", "Knowledge"),
    ("new_message", "New message"),
    ("template", "Template"),
)
# Superseded pinned facts listed per turn, the latest first.
MAX_SUPERSEDED = 10


@dataclass(frozen=True, slots=True)
class Segment:
    """One section of the prompt's bar: its tokens, from token `start`."""

    name: str
    label: str
    tokens: int
    start: int


@dataclass(frozen=True, slots=True)
class InspectedMemory:
    reported: ReportedMemory
    # The memory's row as stored now (None: deleted since).
    turn: Turn | None

    @property
    def day(self) -> str:
        if self.reported.day is not None:
            return self.reported.day
        return self.turn.created_at.date().isoformat() if self.turn is not None else ""


@dataclass(frozen=True, slots=True)
class InspectedFact:
    fact_id: int
    # The fact as stored now (None: no longer stored).
    fact: Fact | None
    # "in system", "new" (in this turn's context), "budget" or "superseded".
    place: str
    # The fact's text or state was changed after the turn.
    is_changed_since: bool = False


@dataclass(frozen=True, slots=True)
class Timing:
    label: str
    seconds: float | None


@dataclass(frozen=True, slots=True)
class TurnInspection:
    message: Turn
    reply: Turn | None
    # None: the turn kept no report (imported history, or a turn before reports).
    report: TurnReport | None
    segments: tuple[Segment, ...] = ()
    memories: tuple[InspectedMemory, ...] = ()
    left_out: tuple[InspectedMemory, ...] = ()
    pinned: tuple[InspectedFact, ...] = ()
    facts_left_out: tuple[InspectedFact, ...] = ()
    timings: tuple[Timing, ...] = ()

    @property
    def has_second(self) -> bool:
        """Whether a second dense list scored any memory of the turn."""
        return any(m.reported.second is not None for m in (*self.memories, *self.left_out))


def segments_of(report: TurnReport) -> tuple[Segment, ...]:
    found: list[Segment] = []
    start = 0
    for name, label in SECTIONS:
        tokens = int(getattr(report.sections, name))
        found.append(Segment(name, label, tokens, start))
        start += tokens
    return tuple(found)


def timings_of(report: TurnReport) -> tuple[Timing, ...]:
    seconds = report.timings
    return (
        Timing("Embed", seconds.embed_s),
        Timing("Search", seconds.search_s),
        Timing("Assemble", seconds.assemble_s),
        Timing("Prefill (to the engine's first token)", seconds.prefill_s),
        Timing("Decode", seconds.decode_s),
        Timing("First token (since the turn was admitted)", seconds.first_token_s),
        Timing("Total (before the reply was stored)", seconds.total_s),
    )


def _changed(fact: Fact | None, at: dt.datetime) -> bool:
    return fact is not None and fact.updated_at > at


def _facts(
    report: TurnReport, facts: dict[int, Fact], at: dt.datetime
) -> tuple[tuple[InspectedFact, ...], tuple[InspectedFact, ...]]:
    """The facts the prompt pinned, and those it left out: over the facts' budget, or
    superseded before the turn while pinned (the turn saw their successor, if pinned)."""
    new = set(report.new_fact_ids)
    pinned = tuple(
        InspectedFact(i, fact, "new" if i in new else "in system", _changed(fact, at))
        for i in report.pinned_fact_ids
        for fact in [facts.get(i)]
    )
    left = [
        InspectedFact(i, facts.get(i), "budget", _changed(facts.get(i), at))
        for i in report.omitted_fact_ids
    ]
    superseded = sorted(
        (
            f
            for f in facts.values()
            if f.is_pinned and f.status == "superseded" and f.valid_to is not None
            if f.valid_from <= at and f.valid_to <= at
        ),
        key=lambda f: f.valid_to or at,
        reverse=True,
    )
    left += [InspectedFact(f.id, f, "superseded") for f in superseded[:MAX_SUPERSEDED]]
    return pinned, tuple(left)


async def inspect_turn(
    messages: MessageRepository,
    fact_memory: FactMemory,
    user_pk: int,
    session_id: str,
    message_id: int,
) -> TurnInspection:
    """A message of a session with its turn's report; raises NotFoundError if the
    session holds no such message."""
    found = await messages.get_reported_turn(session_id, message_id)
    report = report_of_stored(found.report)
    if report is None:
        return TurnInspection(found.message, found.reply, None)
    ids = {m.id for m in (*report.memories, *report.left_out)}
    rows = {t.id: t for t in await messages.list_messages_by_id(user_pk, ids)}
    facts, _history = await fact_memory.list_facts(user_pk, STATUSES, with_history=False)
    pinned, left_facts = _facts(report, {f.id: f for f in facts}, found.message.created_at)
    return TurnInspection(
        message=found.message,
        reply=found.reply,
        report=report,
        segments=segments_of(report),
        memories=tuple(InspectedMemory(m, rows.get(m.id)) for m in report.memories),
        left_out=tuple(InspectedMemory(m, rows.get(m.id)) for m in report.left_out),
        pinned=pinned,
        facts_left_out=left_facts,
        timings=timings_of(report),
    )
