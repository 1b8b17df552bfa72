"""Tenants, API keys and the audit log.

A key's secret is shown once, at creation; only its SHA-256 is stored. Secrets are 256
random bits, so a fast hash is as good as a slow one here: nobody can guess a preimage.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select

from storage.db import Database
from storage.errors import NotFoundError
from storage.models import AdminSession, utc_now
from storage.models import ApiKey as ApiKeyRow
from storage.models import AuditEntry as AuditRow
from storage.models import Tenant as TenantRow
from storage.records import ApiKey, AuditEntry, Tenant, to_record

SECRET_PREFIX = "mck_"
# The prefix and the first characters of the secret name the key in listings and logs.
DISPLAY_CHARS = 12


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """What a valid key grants: its tenant, and whether it reaches the admin API."""

    key_id: int
    key_name: str
    key_prefix: str
    tenant_id: int
    tenant_name: str
    is_admin: bool
    requests_per_minute: int | None


def _owner(key: ApiKeyRow, tenant_name: str) -> KeyOwner:
    return KeyOwner(
        key.id,
        key.name,
        key.prefix,
        key.tenant_id,
        tenant_name,
        key.is_admin,
        key.requests_per_minute,
    )


class AccessRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def ensure_tenant(self, name: str) -> Tenant:
        async with self._db.transaction() as session:
            tenant = await session.scalar(select(TenantRow).where(TenantRow.name == name))
            if tenant is None:
                tenant = TenantRow(name=name, created_at=utc_now())
                session.add(tenant)
                await session.flush()
            return to_record(Tenant, tenant)

    async def get_tenant(self, name: str) -> Tenant:
        async with self._db.transaction() as session:
            tenant = await session.scalar(select(TenantRow).where(TenantRow.name == name))
            if tenant is None:
                raise NotFoundError("tenant", name)
            return to_record(Tenant, tenant)

    async def list_tenants(self) -> list[Tenant]:
        async with self._db.transaction() as session:
            rows = await session.scalars(select(TenantRow).order_by(TenantRow.id))
            return [to_record(Tenant, row) for row in rows.all()]

    async def create_key(
        self,
        tenant_name: str,
        name: str,
        *,
        is_admin: bool = False,
        requests_per_minute: int | None = None,
        secret: str | None = None,
    ) -> tuple[ApiKey, str]:
        """A new key of the tenant (created if new) and its secret, which is not stored.

        The secret is random unless given (an operator's bootstrap key from the
        environment)."""
        tenant = await self.ensure_tenant(tenant_name)
        secret = secret or SECRET_PREFIX + secrets.token_urlsafe(32)
        key = ApiKeyRow(
            tenant_id=tenant.id,
            name=name,
            prefix=secret[:DISPLAY_CHARS],
            key_hash=hash_secret(secret),
            is_admin=is_admin,
            requests_per_minute=requests_per_minute,
            created_at=utc_now(),
        )
        async with self._db.transaction() as session:
            session.add(key)
            await session.flush()
            return to_record(ApiKey, key), secret

    async def list_keys(self) -> list[tuple[ApiKey, str]]:
        """Every key, revoked ones included, with its tenant's name."""
        async with self._db.transaction() as session:
            rows = await session.execute(
                select(ApiKeyRow, TenantRow.name)
                .join(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
                .order_by(ApiKeyRow.id)
            )
            return [(to_record(ApiKey, key), tenant) for key, tenant in rows.all()]

    async def revoke_key(self, key_id: int) -> ApiKey:
        async with self._db.transaction() as session:
            key = await session.get(ApiKeyRow, key_id)
            if key is None:
                raise NotFoundError("api key", key_id)
            if key.revoked_at is None:
                key.revoked_at = utc_now()
            return to_record(ApiKey, key)

    async def get_key_owner_or_none(self, secret: str) -> KeyOwner | None:
        """The owner of an active key with this secret; None if unknown or revoked."""
        async with self._db.transaction() as session:
            row = (
                await session.execute(
                    select(ApiKeyRow, TenantRow.name)
                    .join(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
                    .where(
                        ApiKeyRow.key_hash == hash_secret(secret), ApiKeyRow.revoked_at.is_(None)
                    )
                )
            ).first()
        return None if row is None else _owner(*row)

    # Admin page sessions ----------------------------------------------------------------

    async def create_admin_session(self, key_id: int, ttl_s: float) -> str:
        """A new session of the admin page for an admin key; returns its token (only its
        hash is stored)."""
        token = secrets.token_urlsafe(32)
        now = utc_now()
        async with self._db.transaction() as session:
            session.add(
                AdminSession(
                    token_hash=hash_secret(token),
                    key_id=key_id,
                    created_at=now,
                    expires_at=now + dt.timedelta(seconds=ttl_s),
                )
            )
        return token

    async def get_session_owner_or_none(self, token: str) -> KeyOwner | None:
        """The owner of a live admin session: not expired, its key not revoked."""
        async with self._db.transaction() as session:
            row = (
                await session.execute(
                    select(ApiKeyRow, TenantRow.name)
                    .join(AdminSession, AdminSession.key_id == ApiKeyRow.id)
                    .join(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
                    .where(
                        AdminSession.token_hash == hash_secret(token),
                        AdminSession.expires_at > utc_now(),
                        ApiKeyRow.revoked_at.is_(None),
                    )
                )
            ).first()
        return None if row is None else _owner(*row)

    async def delete_admin_session(self, token: str) -> None:
        """Sign out; expired sessions of any key go at the same time."""
        async with self._db.transaction() as session:
            await session.execute(
                delete(AdminSession).where(
                    (AdminSession.token_hash == hash_secret(token))
                    | (AdminSession.expires_at <= utc_now())
                )
            )

    async def has_active_keys(self) -> bool:
        async with self._db.transaction() as session:
            found = await session.scalar(
                select(ApiKeyRow.id).where(ApiKeyRow.revoked_at.is_(None)).limit(1)
            )
            return found is not None

    async def has_ever_had_keys(self) -> bool:
        """Whether any key was ever made here: revoked keys stay as rows (with
        `revoked_at`), and no key is ever deleted."""
        async with self._db.transaction() as session:
            return await session.scalar(select(ApiKeyRow.id).limit(1)) is not None

    async def is_known_secret(self, secret: str) -> bool:
        """Whether a key with this secret exists, revoked or not."""
        async with self._db.transaction() as session:
            found = await session.scalar(
                select(ApiKeyRow.id).where(ApiKeyRow.key_hash == hash_secret(secret))
            )
            return found is not None

    # Audit log ------------------------------------------------------------------------

    async def record(
        self, actor: str, action: str, target: str, detail: dict[str, Any] | None = None
    ) -> AuditEntry:
        entry = AuditRow(
            at=utc_now(), actor=actor, action=action, target=target, detail=detail or {}
        )
        async with self._db.transaction() as session:
            session.add(entry)
            await session.flush()
            return to_record(AuditEntry, entry)

    async def list_audit(self, *, limit: int, before_id: int | None = None) -> list[AuditEntry]:
        """Newest first; `before_id` pages back."""
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if before_id is not None:
            query = query.where(AuditRow.id < before_id)
        async with self._db.transaction() as session:
            return [to_record(AuditEntry, row) for row in (await session.scalars(query)).all()]
