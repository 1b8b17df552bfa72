"""What operators do to stored memory, for the admin API and the admin page alike: each
change is made, then written to the audit log with the key that made it."""

from __future__ import annotations

from typing import Any

from app.access.keys import Principal
from retrieval.facts.memory import FactMemory
from retrieval.maintenance import MemoryOperations
from storage.access import AccessRepository
from storage.admin import ErasedUser
from storage.errors import NotFoundError
from storage.records import Fact, Session, User
from storage.sessions import SessionRepository


async def audit(
    access: AccessRepository, principal: Principal, action: str, target: str, **detail: Any
) -> None:
    await access.record(principal.actor, action, target, detail)


async def correct_fact(
    fact_memory: FactMemory,
    access: AccessRepository,
    principal: Principal,
    before: Fact,
    user: User,
    *,
    text: str | None,
    is_pinned: bool | None,
    priority: int | None,
) -> Fact:
    """An admin's correction of a fact, in the fact's history and in the audit log."""
    fact = await fact_memory.update_fact(
        before.id, text=text, is_pinned=is_pinned, priority=priority, actor=principal.actor[:64]
    )
    await audit(
        access,
        principal,
        "fact.update",
        f"fact {before.id} of user {user.id}",
        before={"text": before.text, "pinned": before.is_pinned, "priority": before.priority},
        after={"text": fact.text, "pinned": fact.is_pinned, "priority": fact.priority},
    )
    return fact


async def remove_fact(
    fact_memory: FactMemory, access: AccessRepository, principal: Principal, fact_id: int
) -> User:
    """An admin's deletion of a fact, audited; returns the fact's user."""
    fact, user = await fact_memory.get_fact(fact_id)
    await fact_memory.delete_fact(fact_id, principal.actor[:64])
    await audit(
        access, principal, "fact.delete", f"fact {fact_id} of user {user.id}", text=fact.text
    )
    return user


async def erase(
    operations: MemoryOperations, access: AccessRepository, principal: Principal, user_pk: int
) -> ErasedUser:
    """An admin's erasure of a user, audited with what was removed."""
    erased = await operations.erase_user(user_pk)
    await audit(
        access,
        principal,
        "user.erase",
        f"user {user_pk} ({erased.external_id!r}, tenant {erased.tenant_id})",
        removed=erased.removed(),
    )
    return erased


async def session_of_user(
    sessions: SessionRepository, user_pk: int, session_id: str
) -> tuple[Session, User]:
    """The session, if it is this user's; another user's is as missing as none."""
    chat, user = await sessions.get_session(session_id)
    if user.id != user_pk:
        raise NotFoundError("session", session_id)
    return chat, user
