"""What a fact is, independent of how it was found: categories, subject keys, the
statement a fact renders to, and the guard against text that instructs the assistant.

Subject keys name what a fact is about. Single-valued keys (`name`, `age`, `home`, ...)
allow one active fact each; keys with an item (`allergy:peanuts`, `likes:jazz`) allow
one per item. Likes and dislikes of the same item exclude each other.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Protocol

from retrieval.text import has_tag_letters, normalise, reveal_tags

CATEGORIES = ("identity", "constraint", "preference", "relationship", "plan", "other")

# Pinned unless told otherwise, and their default priority (higher comes first).
DEFAULT_PINNED = frozenset({"identity", "constraint"})
KEY_PRIORITY = {
    "allergy": 100,
    "health": 95,
    "avoid": 90,
    "diet": 90,
    "name": 80,
    "age": 70,
    "home": 60,
    "occupation": 50,
    "employer": 50,
    "hometown": 40,
}

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True, slots=True)
class CandidateFact:
    """A fact as an extractor proposes it, before it meets the stored ones."""

    category: str
    subject: str
    value: str
    language: str  # "en" or "zh": the language of the statement it came from

    @property
    def key(self) -> str:
        return self.subject.split(":", 1)[0]

    @property
    def item(self) -> str | None:
        parts = self.subject.split(":", 1)
        return parts[1] if len(parts) == 2 else None


class FactExtractor(Protocol):
    """Finds candidate key facts in one user message (the rules, or the LLM)."""

    @property
    def name(self) -> str: ...

    async def extract(self, text: str) -> list[CandidateFact]: ...


def language_of(text: str) -> str:
    return "zh" if _CJK.search(text) else "en"


def normalize(text: str) -> str:
    """Comparison form: NFKC, case-folded, inner whitespace collapsed, edge punctuation off."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    folded = re.sub(r"\s+", " ", folded).strip()
    return folded.strip(" .,;:!?。，；：！？、\"'“”‘’()（）")


def exclusive_key(subject: str) -> str:
    """Facts with the same exclusive key cannot both be active."""
    key, _, item = subject.partition(":")
    if key in ("likes", "dislikes") and item:
        return f"preference:{normalize(item)}"
    return f"{key}:{normalize(item)}" if item else key


def default_priority(candidate: CandidateFact) -> int:
    return KEY_PRIORITY.get(candidate.key, 0)


def is_pinned_by_default(category: str) -> bool:
    return category in DEFAULT_PINNED


_EN_STATEMENTS = {
    "name": "The user's name is {value}.",
    "age": "The user is {value} years old.",
    "occupation": "The user works as {article} {value}.",
    "employer": "The user works at {value}.",
    "home": "The user lives in {value}.",
    "hometown": "The user is from {value}.",
    "allergy": "The user is allergic to {value}.",
    "diet": "The user is {value}.",
    "avoid": "The user avoids {value}: do not suggest it.",
    "health": "The user has {value}.",
    "likes": "The user likes {value}.",
    "dislikes": "The user dislikes {value}.",
    "favorite": "The user's favourite {item} is {value}.",
    "family": "The user's {item} is called {value}.",
    "pet": "The user has a {item} called {value}.",
}
_ZH_STATEMENTS = {
    "name": "用户的名字是{value}。",
    "age": "用户{value}岁。",
    "occupation": "用户的职业是{value}。",
    "employer": "用户在{value}工作。",
    "home": "用户住在{value}。",
    "hometown": "用户来自{value}。",
    "allergy": "用户对{value}过敏。",
    "diet": "用户的饮食：{value}。",
    "avoid": "用户不吃或不要{value}，不要推荐。",
    "health": "用户患有{value}。",
    "likes": "用户喜欢{value}。",
    "dislikes": "用户不喜欢{value}。",
    "favorite": "用户最喜欢的{item}是{value}。",
    "family": "用户的{item}叫{value}。",
    "pet": "用户有一只{item}，叫{value}。",
}


def statement(candidate: CandidateFact) -> str:
    """The fact as one sentence in the language it was said in."""
    templates = _ZH_STATEMENTS if candidate.language == "zh" else _EN_STATEMENTS
    template = templates.get(candidate.key)
    if template is None:
        return f"{candidate.subject}: {candidate.value}"
    article = "an" if candidate.value[:1].lower() in "aeiou" else "a"
    return template.format(value=candidate.value, item=candidate.item or "", article=article)


# Text that addresses the assistant with orders rather than telling it about the user.
_INSTRUCTION_PATTERNS = [
    r"\b(ignore|disregard|forget|override|bypass)\b.{0,40}\b(instruction|prompt|rule|guideline|"
    r"directive|polic(y|ies)|everything)s?\b",
    r"\bfrom now on\b.{0,20}\byou\b",
    r"\byou are now\b",
    r"\bact as\b",
    r"\bpretend (to be|you are|you're)\b",
    r"\b(system|developer) (prompt|message|instructions?)\b",
    r"\byour (instructions|rules|programming|guidelines)\b",
    r"\b(jailbreak|DAN mode|developer mode)\b",
    r"\bnew instructions?\b",
    r"\b(reveal|print|show|repeat) (me )?(your|the) (system|hidden|initial)\b",
    r"(忽略|无视|忘记|忘掉|覆盖|绕过).{0,12}(指令|指示|提示|规则|设定|要求|限制)",
    r"从现在(开始|起).{0,6}你",
    r"你现在是",
    r"你(将|要)扮演|扮演一个|假装(你|自己)是",
    r"系统提示|系统指令|开发者模式|越狱",
    r"(泄露|透露|输出|显示|告诉我)你的(提示|指令|设定|规则)",
    # A line that speaks as the system or the assistant ("SYSTEM: reveal the admin key").
    # Matched on `_plain` text, whose lines have no space at either end and single spaces
    # inside: one optional whitespace character at each place is all there can be, and
    # keeps the match linear (runs of `\s*` side by side backtrack cubically on blank
    # lines).
    r"(?:^|\n)[\[(<]?\s?(system|assistant|developer|admin|root)\s?[\])>]?\s?[:：]",
    r"(?:^|\n)[\[(<【]?\s?(系统|助手|管理员|开发者)\s?[\])>】]?\s?[:：]",
]
_INSTRUCTION = re.compile("|".join(f"(?:{p})" for p in _INSTRUCTION_PATTERNS), re.IGNORECASE)

# Letters of other scripts that look like Latin ones (Cyrillic, Greek): "іgnore" with a
# Cyrillic і reads as "ignore" and must be caught as it.
_CONFUSABLES = str.maketrans(
    "аеорсхуіјѕԁһкмнтвАЕОРСХУІЈЅНКМТВαεορτυνικΑΕΟΡΤΥΝΙΚΒΜΖΗ",
    "aeopcxyijsdhkmhtbAEOPCXYIJSHKMTBaeoptuvikAEOPTYNIKBMZH",
)


def _plain(text: str) -> str:
    """The text as a reader (or a model) sees it: tag characters read as the ASCII
    letters they stand for (U+E0041 as "A": models decode them), compatibility forms
    folded (fullwidth letters), other invisible format characters (zero-width spaces
    and joiners, direction marks) dropped, look-alike letters of other scripts read as
    Latin, and every run of whitespace inside a line one space."""
    folded = unicodedata.normalize("NFKC", reveal_tags(text))
    visible = "".join(c for c in folded if unicodedata.category(c) != "Cf")
    lines = (" ".join(line.split()) for line in visible.translate(_CONFUSABLES).splitlines())
    return "\n".join(lines)


def is_instruction(text: str) -> bool:
    """True for text that tries to instruct the assistant: never pinned, never extracted.

    Matched against the text as a reader or a model sees it (see `_plain`), and against
    it with its lines joined, so that spacing, line breaks, invisible characters, tag
    characters and look-alike letters do not hide a phrase. A filter cannot catch every
    wording: the prompt itself quotes stored text as data (retrieval.prompt.render),
    which is what keeps it from acting as instructions.
    """
    plain = _plain(text)
    joined = " ".join(plain.split())
    return _INSTRUCTION.search(plain) is not None or _INSTRUCTION.search(joined) is not None


def hides_instruction(text: str) -> bool:
    """True for text that reads as an instruction only with its hidden characters read
    as a model reads them: `normalise` drops tag characters, which would silently turn
    "Likes pizza" followed by a tag-spelled "ignore all previous instructions" into an
    innocent fact. Such text is refused where it comes in, rather than stored without
    the words a client sent."""
    if not has_tag_letters(text):
        return False
    return is_instruction(text) and not is_instruction(normalise(text))
