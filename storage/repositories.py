"""Every repository of one database, for the composition root and for tests."""

from __future__ import annotations

from dataclasses import dataclass

from storage.access import AccessRepository
from storage.admin import AdminRepository
from storage.backup import BackupRepository
from storage.db import Database
from storage.embeddings import EmbeddingRepository
from storage.facts import FactRepository
from storage.knowledge import KnowledgeRepository
from storage.messages import MessageRepository
from storage.sessions import SessionRepository
from storage.summaries import SummaryRepository
from storage.users import UserRepository


@dataclass(frozen=True, slots=True)
class Repositories:
    db: Database
    users: UserRepository
    sessions: SessionRepository
    messages: MessageRepository
    embeddings: EmbeddingRepository
    summaries: SummaryRepository
    facts: FactRepository
    knowledge: KnowledgeRepository
    access: AccessRepository
    admin: AdminRepository
    backup: BackupRepository

    @classmethod
    def of(cls, db: Database) -> Repositories:
        return cls(
            db,
            UserRepository(db),
            SessionRepository(db),
            MessageRepository(db),
            EmbeddingRepository(db),
            SummaryRepository(db),
            FactRepository(db),
            KnowledgeRepository(db),
            AccessRepository(db),
            AdminRepository(db),
            BackupRepository(db),
        )
