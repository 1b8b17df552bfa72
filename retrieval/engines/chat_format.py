"""What every engine adapter does to a chat before its template sees it, and counting a
chat prompt's tokens without rendering it where the template allows.

The prompt layout (`retrieval.prompt.layout`) is one system message, first, then user and
assistant messages alternating. A template without a system role (Gemma's raises on
one) gets the system text at the head of the first user message instead, which is
what such templates document for system prompts; it is prefix-stable like the rest.

For templates like ChatML a prompt's token count is a constant plus, per message, a
per-role constant plus its content's own tokens. The context assembler counts many
candidate prompts per turn; with the overheads measured once, each count is a sum of
cached per-text counts instead of a tokenisation of the whole prompt.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from retrieval.protocols import ChatMessage

# A conversation of the layout's shape mixing scripts and punctuation: if the additive
# count matches the full count here, the template is taken as additive.
PROBE = (
    ChatMessage("system", "Be brief, friendly; answer in English or 中文."),
    ChatMessage("user", "I'm Xiao Ming, 我今年6岁了. Peanuts? 我对花生过敏!"),
    ChatMessage("assistant", "Noted: no peanuts (花生) for you."),
    ChatMessage("user", 'Memories:\n- [5 Jan 2026] user: "I like tea"\n\nA snack?'),
)


def fold_system(messages: Sequence[ChatMessage], accepts_system: bool) -> list[ChatMessage]:
    """The chat as a template without a system role takes it: a leading system message
    becomes the head of the first user message (or the first user message itself)."""
    if accepts_system or not messages or messages[0].role != "system":
        return list(messages)
    system, rest = messages[0], list(messages[1:])
    if rest and rest[0].role == "user":
        return [ChatMessage("user", f"{system.content}\n\n{rest[0].content}"), *rest[1:]]
    return [ChatMessage("user", system.content), *rest]


# What a template's markers look like: <|im_start|>, <start_of_turn>, </s>, [INST], <<SYS>>.
_MARKER = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|</?[A-Za-z_][\w-]{0,30}>|\[/?[A-Z_]{2,20}\]|<</?[A-Z]{2,10}>>"
)
# Special-token syntax that no message content may carry, whatever the template.
_SPECIAL = re.compile(r"<\|[^<>|\s]{1,40}\|>")
_HOLDER = "\ufffc"
# Inserted after a marker's first character: the text reads the same, but it is no
# longer the marker for the tokenizer (special tokens) or the template's own syntax.
WORD_JOINER = "\u2060"


async def template_markers(
    render: Callable[[Sequence[ChatMessage]], Awaitable[str]], accepts_system: bool
) -> frozenset[str]:
    """The markers a template writes between messages, from a rendering of a probe chat
    whose contents are placeholders."""
    probe = [
        ChatMessage("system", _HOLDER),
        ChatMessage("user", _HOLDER),
        ChatMessage("assistant", _HOLDER),
        ChatMessage("user", _HOLDER),
    ]
    pieces = (await render(fold_system(probe, accepts_system))).split(_HOLDER)
    return frozenset(marker for piece in pieces for marker in _MARKER.findall(piece))


def neutralise(text: str, markers: frozenset[str]) -> str:
    """`text` with every template marker and special-token look-alike broken by a word
    joiner, so that a message can never close itself and open another role's."""
    if "<" not in text and "[" not in text:
        return text
    for marker in markers:
        if marker in text:
            text = text.replace(marker, f"{marker[0]}{WORD_JOINER}{marker[1:]}")
    return _SPECIAL.sub(lambda m: f"<{WORD_JOINER}{m.group()[1:]}", text)


def prepare(
    messages: Sequence[ChatMessage], accepts_system: bool, markers: frozenset[str]
) -> list[ChatMessage]:
    """The chat as the adapter hands it to the template: markers neutralised in every
    content, the system message folded where the template has no system role."""
    cleaned = [ChatMessage(m.role, neutralise(m.content, markers)) for m in messages]
    return fold_system(cleaned, accepts_system)


async def renders(render: Callable[[Sequence[ChatMessage]], Awaitable[object]]) -> bool:
    """Whether a template takes a system message before a user message."""
    try:
        await render([ChatMessage("system", "x"), ChatMessage("user", "x")])
    except Exception:  # a template's own refusal: jinja2 or the server raise their own kinds
        return False
    return True


@dataclass(frozen=True, slots=True)
class MessageOverhead:
    """Template tokens per role, plus the prompt's fixed part (generation prompt, BOS, and
    the system message's own markers when the chat opens with one)."""

    per_role: dict[str, int]
    fixed: int
    opens_with_system: bool
    count_text: Callable[[str], Awaitable[int]]

    @classmethod
    async def measure(
        cls,
        full_count: Callable[[Sequence[ChatMessage]], Awaitable[int]],
        count_text: Callable[[str], Awaitable[int]],
        *,
        opens_with_system: bool,
    ) -> MessageOverhead | None:
        """The overheads of chats that open with a system message (or, for a template
        without a system role, with a user message), or None when the template's count
        is not additive for them."""
        one = await count_text("x")
        user, assistant = ChatMessage("user", "x"), ChatMessage("assistant", "x")
        lead = [ChatMessage("system", "x"), user] if opens_with_system else [user]
        base = await full_count(lead)
        with_reply = await full_count([*lead, assistant])
        per_role = {
            "assistant": with_reply - base - one,
            "user": await full_count([*lead, assistant, user]) - with_reply - one,
            "system": 0,
        }
        fixed = base - per_role["user"] - len(lead) * one
        overhead = cls(per_role, fixed, opens_with_system, count_text)
        probe = PROBE if opens_with_system else fold_system(PROBE, accepts_system=False)
        if await overhead.count(probe) != await full_count(probe):
            return None
        return overhead

    async def count(self, messages: Sequence[ChatMessage]) -> int | None:
        """The prompt's token count, or None where only a full count is exact (a chat of
        another shape than the one measured: templates add a default system message
        when none opens the chat, and some treat a later one apart)."""
        if not messages or (messages[0].role == "system") != self.opens_with_system:
            return None
        if any(m.role not in self.per_role for m in messages):
            return None
        if any(m.role == "system" for m in messages[1:]):
            return None
        contents = [await self.count_text(m.content) for m in messages]
        return self.fixed + sum(
            self.per_role[m.role] + n for m, n in zip(messages, contents, strict=True)
        )
