"""The rule-based fact extractor: no model, English and Chinese first-person statements.

A message is cut into sentences and clauses; each language's rules are regular
expressions over a sentence. A match counts only when its clause, up to the value,
holds nothing that makes it a question, a hypothetical, a past state or somebody
else's fact. Messages that try to instruct the assistant yield nothing at all.

Cost: every rule is a backtracking `re` pattern written so that it stays at most
quadratic (no alternation under a repeat that can split the same text two ways, no
three unbounded repeats over a shared character in a row: `tools/check_regexes.py`
checks both in `make lint`), and no rule reads more than
`MAX_PIECE_CHARS` characters at once: a sentence is read whole when it is shorter,
in pieces cut after a clause mark (or, for a clause longer than that, hard) otherwise.
So one call costs time linear in the message, each rule's match a bounded slice, and
`extract` runs it in a worker thread, off the event loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import anyio

from retrieval.facts.model import CandidateFact, is_instruction, normalize

_FLAGS = re.IGNORECASE
# Keys that hold one fact per item: the subject names the item (`allergy:peanuts`).
ITEM_KEYS = frozenset({"allergy", "avoid", "health", "likes", "dislikes"})


@dataclass(frozen=True)
class Rule:
    category: str
    key: str
    pattern: str
    # The value is a list ("peanuts and shellfish"): one fact per item.
    items: bool = False
    transform: Callable[[str], str | None] | None = None
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern, _FLAGS))


@dataclass(frozen=True, slots=True)
class Clause:
    """Where a match sits: its clause up to the value and after it, the sentence before."""

    before: str
    after: str
    earlier: str
    is_question: bool


@dataclass(frozen=True)
class Language:
    """What one language contributes: rules, and how to read its sentences."""

    code: str
    rules: Sequence[Rule]
    # Does this clause, around this rule's match, state no fact?
    skips: Callable[[Rule, Clause], bool]
    clean: Callable[[str], str | None]
    split_items: Callable[[str], list[str]]
    # Text the rules read; same length as the original, so spans map back.
    fold: Callable[[str], str] = lambda text: text


_SENTENCE = re.compile(r"[^.!?;。！？；\n]+[.!?;。！？；]*")
_CLAUSE = re.compile(r"[^,，:：]+")
_CLAUSE_MARKS = ",，:："
# The most characters one rule reads at once (far above a spoken sentence).
MAX_PIECE_CHARS = 300


def pieces(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """Spans of `text[start:end]` of at most MAX_PIECE_CHARS each, cut just after the
    last clause mark that fits, or hard where none does."""
    while end - start > MAX_PIECE_CHARS:
        limit = start + MAX_PIECE_CHARS
        cut = max(text.rfind(mark, start, limit) for mark in _CLAUSE_MARKS) + 1
        if cut <= start:
            cut = limit
        yield start, cut
        start = cut
    yield start, end


def _clause_at(sentence: str, position: int) -> tuple[int, int]:
    for clause in _CLAUSE.finditer(sentence):
        if clause.start() <= position < clause.end():
            return clause.start(), clause.end()
    return 0, len(sentence)


def _is_question_clause(sentence: str, end: int) -> bool:
    """The clause closes its sentence and the sentence ends with a question mark."""
    rest = sentence[end:].strip()
    return sentence.rstrip().endswith(("?", "？")) and not re.search(r"[^\s?？!！.。]", rest)


class RuleExtractor:
    """Extracts candidate facts from one user message."""

    name = "rules"

    def __init__(self, languages: Sequence[Language]) -> None:
        self._languages = languages

    async def extract(self, text: str) -> list[CandidateFact]:
        return await anyio.to_thread.run_sync(self.extract_now, text)

    def extract_now(self, text: str) -> list[CandidateFact]:
        """The same, synchronously: rules need no I/O."""
        if is_instruction(text):
            return []
        found: dict[str, CandidateFact] = {}
        for language in self._languages:
            folded = language.fold(text)
            for sentence in _SENTENCE.finditer(folded):
                for start, end in pieces(folded, sentence.start(), sentence.end()):
                    piece, original = folded[start:end], text[start:end]
                    for fact in self._sentence_facts(language, piece, original):
                        found.setdefault(normalize(fact.subject), fact)
        return list(found.values())

    def _sentence_facts(
        self, language: Language, sentence: str, original: str
    ) -> list[CandidateFact]:
        facts: list[CandidateFact] = []
        for rule in language.rules:
            for match in rule.regex.finditer(sentence):
                facts += self._match_facts(language, rule, match, sentence, original)
        return facts

    def _match_facts(
        self,
        language: Language,
        rule: Rule,
        match: re.Match[str],
        sentence: str,
        original: str,
    ) -> list[CandidateFact]:
        start, end = match.span("v")
        # The clause where the match starts decides (a list value may run past it).
        clause_start, clause_end = _clause_at(sentence, match.start())
        clause = Clause(
            before=sentence[clause_start:start],
            after=sentence[end:clause_end],
            earlier=sentence[:clause_start],
            is_question=_is_question_clause(sentence, clause_end),
        )
        if language.skips(rule, clause):
            return []
        raw = original[start:end]
        values = language.split_items(raw) if rule.items else [raw]
        item_of_key = None
        if "k" in rule.regex.groupindex:
            item_of_key = original[match.start("k") : match.end("k")]
        facts = []
        for value in values:
            cleaned = language.clean(value)
            if cleaned and rule.transform is not None:
                cleaned = rule.transform(cleaned)
            if not cleaned:
                continue
            facts.append(_candidate(language.code, rule, cleaned, item_of_key))
        return facts


def _candidate(language: str, rule: Rule, value: str, item_of_key: str | None) -> CandidateFact:
    if item_of_key is not None:
        item = item_of_key.strip()
        subject = f"{rule.key}:{item.lower() if language == 'en' else item}"
    elif rule.key in ITEM_KEYS:
        subject = f"{rule.key}:{value}"
    else:
        subject = rule.key
    return CandidateFact(rule.category, subject, value, language)
