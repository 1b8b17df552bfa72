"""Fact extractors behind one interface (`FactExtractor` in retrieval.protocols)."""

from __future__ import annotations

from retrieval.facts.rules.en import ENGLISH
from retrieval.facts.rules.engine import RuleExtractor
from retrieval.facts.rules.zh import CHINESE


def rule_extractor() -> RuleExtractor:
    return RuleExtractor([ENGLISH, CHINESE])
