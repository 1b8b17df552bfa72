"""The vectors of messages, with the model that made them: every vector index of turns is
rebuilt from here."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from storage.db import Database, insert_or_skip
from storage.models import MessageEmbedding, User

BATCH = 500


@dataclass(frozen=True, slots=True)
class StoredVector:
    message_id: int
    user_pk: int
    vector: bytes


@dataclass(frozen=True, slots=True)
class VectorSet:
    """Vectors of one model (its name as stored, with the text recipe) for some messages."""

    model: str
    dimension: int
    vectors: Sequence[StoredVector]


async def bump_memory_versions(session: AsyncSession, user_pks: Collection[int]) -> dict[int, int]:
    """Count a change of each user's stored vectors, in the caller's transaction; returns
    each user's new count (users that no longer exist are left out)."""
    versions: dict[int, int] = {}
    for user_pk in sorted(set(user_pks)):
        version = await session.scalar(
            update(User)
            .where(User.id == user_pk)
            .values(memory_version=User.memory_version + 1)
            .returning(User.memory_version)
        )
        if version is not None:
            versions[user_pk] = int(version)
    return versions


def _insert_missing(session: AsyncSession) -> Any:
    """An insert of vectors that leaves a message's existing vector alone: another process
    may have stored it between our read and this write (one starting up repairs the
    messages it finds without a vector while another is about to store theirs), and both
    made it from the same text with the same model."""
    return insert_or_skip(session, MessageEmbedding, ["message_id", "model"])


class EmbeddingRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def save_embeddings(
        self, sets: Sequence[VectorSet], *, replace: bool = True
    ) -> dict[int, int]:
        """Store the vectors of messages, of one model or several, in one transaction;
        `replace=False` for messages just stored or found without one (a vector another
        process stored for one of them meanwhile is kept), else earlier vectors of them by
        the same model are replaced. Returns each user's new change count
        (`bump_memory_versions`)."""
        sets = [item for item in sets if item.vectors]
        if not sets:
            return {}
        async with self._db.transaction() as session:
            for item in sets:
                ids = [vector.message_id for vector in item.vectors]
                if replace:
                    for start in range(0, len(ids), BATCH):
                        await session.execute(
                            delete(MessageEmbedding).where(
                                MessageEmbedding.model == item.model,
                                MessageEmbedding.message_id.in_(ids[start : start + BATCH]),
                            )
                        )
                await session.execute(
                    _insert_missing(session),
                    [
                        {
                            "message_id": vector.message_id,
                            "user_pk": vector.user_pk,
                            "model": item.model,
                            "dimension": item.dimension,
                            "vector": vector.vector,
                        }
                        for vector in item.vectors
                    ],
                )
            user_pks = [vector.user_pk for item in sets for vector in item.vectors]
            return await bump_memory_versions(session, user_pks)

    async def get_memory_version(self, user_pk: int) -> int:
        """The user's change count (0 for a user that does not exist)."""
        async with self._db.transaction() as session:
            version = await session.scalar(select(User.memory_version).where(User.id == user_pk))
            return int(version or 0)

    async def list_embedding_models(self) -> list[tuple[str, int]]:
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(MessageEmbedding.model, MessageEmbedding.dimension).distinct()
            )
            return [(model, int(dim)) for model, dim in rows.all()]

    async def count_vectors(self) -> dict[str, int]:
        """How many messages hold a vector of each model."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(MessageEmbedding.model, func.count()).group_by(MessageEmbedding.model)
            )
            return {model: int(count) for model, count in rows.all()}

    async def list_user_vector_ids(self, user_pk: int, model: str) -> set[int]:
        """Ids of the user's messages that hold a vector of `model`."""
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(MessageEmbedding.message_id).where(
                    MessageEmbedding.user_pk == user_pk, MessageEmbedding.model == model
                )
            )
            return {int(i) for i in rows.all()}

    async def list_user_vectors(
        self, user_pk: int, model: str, ids: Collection[int] | None = None
    ) -> list[StoredVector]:
        """Vectors of `model` of a user, by message id; all of them when `ids` is None."""
        query = select(MessageEmbedding.message_id, MessageEmbedding.vector).where(
            MessageEmbedding.user_pk == user_pk, MessageEmbedding.model == model
        )
        chunks: list[list[int] | None] = [None]
        if ids is not None:
            ordered = sorted(ids)
            chunks = [ordered[i : i + BATCH] for i in range(0, len(ordered), BATCH)]
        found: list[StoredVector] = []
        async with self._db.transaction() as session:
            for chunk in chunks:
                chunk_query = (
                    query if chunk is None else query.where(MessageEmbedding.message_id.in_(chunk))
                )
                rows = await session.execute(chunk_query.order_by(MessageEmbedding.message_id))
                found.extend(StoredVector(int(mid), user_pk, vec) for mid, vec in rows.all())
        return found

    async def delete_user_embeddings(self, user_pk: int) -> None:
        async with self._db.transaction() as session:
            await session.execute(
                delete(MessageEmbedding).where(MessageEmbedding.user_pk == user_pk)
            )
            await bump_memory_versions(session, [user_pk])

    async def delete_all_embeddings(self) -> None:
        async with self._db.transaction() as session:
            await session.execute(delete(MessageEmbedding))
            await session.execute(update(User).values(memory_version=User.memory_version + 1))
