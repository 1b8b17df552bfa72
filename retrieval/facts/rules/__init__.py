"""Fact extractors behind one interface (`FactExtractor` in retrieval.facts.model)."""

from __future__ import annotations

from retrieval.facts.rules.en import ENGLISH
from retrieval.facts.rules.engine import RuleExtractor
from retrieval.facts.rules.zh import CHINESE


def rule_extractor() -> RuleExtractor:
    return RuleExtractor([ENGLISH, CHINESE])
