"""Records as storage hands them out, built for unit tests of the layers above."""

from __future__ import annotations

import datetime as dt
from typing import Any

from retrieval.knowledge.base import KnowledgeHit
from retrieval.turns import SearchHit
from storage.knowledge import StoredChunk
from storage.records import Fact, Turn

WHEN = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)


def turn(
    id: int,  # noqa: A002 - the record's field
    content: str,
    role: str = "user",
    *,
    name: str | None = None,
    seq: int | None = None,
    session_id: str = "s-old",
    created_at: dt.datetime = WHEN,
    token_count: int | None = None,
    **extra: Any,
) -> Turn:
    return Turn(
        id=id,
        session_id=session_id,
        user_pk=1,
        seq=id if seq is None else seq,
        role=role,
        name=name,
        content=content,
        created_at=created_at,
        external_id=None,
        token_count=len(content.split()) if token_count is None else token_count,
        **extra,
    )


def hit(id: int, content: str, score: float, **fields: Any) -> SearchHit:  # noqa: A002
    return SearchHit(turn(id, content, **fields), score)


def chunk_hit(
    id: int,  # noqa: A002
    text: str,
    score: float,
    *,
    title: str = "Handbook",
    heading_path: str = "",
) -> KnowledgeHit:
    chunk = StoredChunk(id, "d", 1, None, 0, text, len(text.split()), heading_path, title)
    return KnowledgeHit(chunk, score)


def fact(
    id: int,  # noqa: A002
    text: str,
    *,
    priority: int = 0,
    category: str = "constraint",
    when: dt.datetime = WHEN,
) -> Fact:
    return Fact(
        id=id,
        user_pk=1,
        text=text,
        category=category,
        subject=None,
        value=None,
        status="active",
        is_pinned=True,
        priority=priority,
        valid_from=when,
        valid_to=None,
        source_message_ids=[],
        created_at=when,
        updated_at=when,
        model=None,
        vector=None,
    )
