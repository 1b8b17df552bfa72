"""Rolling session summaries: versions are appended, the newest is current."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.db import transaction
from storage.models import Message, SessionSummary, utc_now


class SummaryStore:
    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self._sessionmaker = sessionmaker

    async def get_current_or_none(self, session_id: str) -> SessionSummary | None:
        async with transaction(self._sessionmaker) as session:
            return await session.scalar(
                select(SessionSummary)
                .where(SessionSummary.session_id == session_id)
                .order_by(SessionSummary.version.desc())
                .limit(1)
            )

    async def list_summaries(self, session_id: str) -> list[SessionSummary]:
        async with transaction(self._sessionmaker) as session:
            rows = await session.scalars(
                select(SessionSummary)
                .where(SessionSummary.session_id == session_id)
                .order_by(SessionSummary.version)
            )
            return list(rows.all())

    async def add_summary(
        self,
        session_id: str,
        *,
        version: int,
        through_seq: int,
        pruned_seqs: Sequence[int],
        pinned_fact_ids: Sequence[int],
        text: str,
        summarizer: str,
        token_count: int,
    ) -> SessionSummary:
        """Append a version; a concurrent writer of the same version fails (unique key)."""
        row = SessionSummary(
            session_id=session_id,
            version=version,
            through_seq=through_seq,
            pruned_seqs=sorted(pruned_seqs),
            pinned_fact_ids=sorted(pinned_fact_ids),
            text=text,
            summarizer=summarizer,
            token_count=token_count,
            created_at=utc_now(),
        )
        async with transaction(self._sessionmaker) as session:
            session.add(row)
        return row

    async def set_context_note(
        self,
        message_id: int,
        note: Sequence[str],
        tokens: int,
        shown_ids: Sequence[int],
        shown_fact_ids: Sequence[int],
    ) -> None:
        """Keep the per-turn context a message was sent with (see Message.context_note)."""
        async with transaction(self._sessionmaker) as session:
            await session.execute(
                update(Message)
                .where(Message.id == message_id)
                .values(
                    context_note=list(note),
                    context_note_tokens=tokens,
                    context_note_ids=list(shown_ids),
                    context_note_fact_ids=list(shown_fact_ids),
                )
            )
