"""The ReDoS checker that `make lint` runs (tools/check_regexes.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from retrieval.facts import model
from retrieval.facts.rules import en, zh
from retrieval.knowledge import chunking
from retrieval.window import smalltalk

TOOL = Path(__file__).resolve().parent.parent / "tools" / "check_regexes.py"


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_regexes", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_regexes"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("(?:现在|刚|刚刚|但|但是|是)*X", "ambiguous strings under a repeat"),
        (r"^(?:一些|所有的?|的)+", "ambiguous strings under a repeat"),
        (r"(?:了|啦|哈+)+$", "regexploit: starriness 11"),
        (r"^\W*(?:(?:hi|哈+)[\s,.]*)+$", "a repeat of one character under a repeat"),
        (r"(?:^|\n)\s*[\[(<]?\s*(system|admin)\s*[:：]", "three overlapping repeats in a row"),
        (r"\bi work at\s+[^,.;!?]+?\s+as\s+x", "three overlapping repeats in a row"),
    ],
)
def test_super_linear_patterns_are_refused(checker: ModuleType, pattern: str, problem: str) -> None:
    found = checker.problems(checker.Found("test", pattern, 0))
    assert found is not None
    assert any(p.startswith(problem) for p in found), found


@pytest.mark.parametrize(
    "pattern",
    [
        "(?:现在|刚|但|是)*X",
        r"^(?:一些|所有|的)+",
        r"(?:了|啦|哈)+$",
        r"^\W*(?:(?:hi|哈)[\s,.]*)+$",
        r"(?:^|\n)[ \t]*[\[(<]?(system|admin)[:：]",
        r"\bi work at\s+[^,.;!?]*?[^,.;!?\s]\s+as\s+x",
        r"(#{1,6})([ \t]+)",
    ],
)
def test_their_rewritings_pass(checker: ModuleType, pattern: str) -> None:
    assert checker.problems(checker.Found("test", pattern, 0)) == []


def test_the_service_patterns_are_collected(checker: ModuleType) -> None:
    # Built at import (joined lists, rule tables) as well as written out.
    held = [
        *(rule.regex for rule in zh.RULES + en.RULES),
        model._INSTRUCTION,
        chunking._HEADING,
        smalltalk._PHATIC,
    ]
    collected = {(found.pattern, found.flags) for found in checker.patterns()}
    assert {(p.pattern, p.flags & ~re.UNICODE) for p in held} <= collected
