"""Users of the client applications, known by the client's own id within a tenant."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.db import Database
from storage.errors import NotFoundError
from storage.models import User as UserRow
from storage.models import utc_now
from storage.records import User, to_record

# The largest id a BigInteger column holds.
MAX_ID = 2**63 - 1


def is_row_id(value: int) -> bool:
    """Whether a row can have this id (a larger one would overflow the driver)."""
    return 1 <= value <= MAX_ID


class UserRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_user_or_none(self, external_id: str, *, tenant_id: int) -> User | None:
        async with self._db.transaction() as session:
            row = await user_row_or_none(session, tenant_id, external_id)
            return None if row is None else to_record(User, row)

    async def get_user(self, external_id: str, *, tenant_id: int) -> User:
        user = await self.get_user_or_none(external_id, tenant_id=tenant_id)
        if user is None:
            raise NotFoundError("user", external_id)
        return user

    async def get_user_by_pk(self, user_pk: int) -> User:
        if not is_row_id(user_pk):
            raise NotFoundError("user", user_pk)
        async with self._db.transaction() as session:
            row = await session.get(UserRow, user_pk)
            if row is None:
                raise NotFoundError("user", user_pk)
            return to_record(User, row)

    async def ensure_user(self, external_id: str, *, tenant_id: int) -> User:
        """The user, created if unknown (a client may state facts before any session)."""
        async with self._db.transaction() as session:
            return to_record(User, await get_or_add_user(session, tenant_id, external_id))

    async def list_user_pks(self) -> list[int]:
        async with self._db.transaction() as session:
            return [
                int(i) for i in (await session.scalars(select(UserRow.id).order_by(UserRow.id)))
            ]


async def user_row_or_none(
    session: AsyncSession, tenant_id: int, external_id: str
) -> UserRow | None:
    return await session.scalar(
        select(UserRow).where(UserRow.tenant_id == tenant_id, UserRow.external_id == external_id)
    )


async def get_or_add_user(session: AsyncSession, tenant_id: int, external_id: str) -> UserRow:
    """Inside a caller's transaction: the user's row, added if unknown."""
    row = await user_row_or_none(session, tenant_id, external_id)
    if row is None:
        row = UserRow(tenant_id=tenant_id, external_id=external_id, created_at=utc_now())
        session.add(row)
        await session.flush()
    return row
