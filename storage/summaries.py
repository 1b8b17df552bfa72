"""Rolling session summaries: versions are appended, the newest is current."""

from __future__ import annotations

from sqlalchemy import select

from storage.db import Database
from storage.models import SessionSummary, utc_now
from storage.records import Summary, to_record


class SummaryRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list_summaries(self, session_id: str) -> list[Summary]:
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(SessionSummary)
                .where(SessionSummary.session_id == session_id)
                .order_by(SessionSummary.version)
            )
            return [to_record(Summary, row) for row in rows.all()]

    async def add_summary(self, summary: Summary) -> Summary:
        """Append a version; a concurrent writer of the same version fails (unique key)."""
        row = SessionSummary(
            session_id=summary.session_id,
            version=summary.version,
            through_seq=summary.through_seq,
            pruned_seqs=sorted(summary.pruned_seqs or ()),
            pinned_fact_ids=sorted(summary.pinned_fact_ids or ()),
            text=summary.text,
            summarizer=summary.summarizer,
            token_count=summary.token_count,
            created_at=utc_now(),
        )
        async with self._db.transaction() as session:
            session.add(row)
        return to_record(Summary, row)
