"""What operators do to stored memory, for the admin API and the admin page alike: each
change is made, then written to the audit log with the key that made it."""

from __future__ import annotations

from typing import Any

from app.access.keys import Principal
from app.api import admin_schemas as body
from app.api.bodies import erased_body
from retrieval.facts.memory import FactMemory
from retrieval.maintenance import MemoryOperations
from storage.access import AccessStore
from storage.errors import NotFoundError
from storage.models import ChatSession, Fact, User
from storage.repository import Store


async def audit(
    access: AccessStore, principal: Principal, action: str, target: str, **detail: Any
) -> None:
    await access.record(principal.actor, action, target, detail)


async def correct_fact(
    fact_memory: FactMemory,
    access: AccessStore,
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
    fact_memory: FactMemory, access: AccessStore, principal: Principal, fact_id: int
) -> User:
    """An admin's deletion of a fact, audited; returns the fact's user."""
    fact, user = await fact_memory.store.get_fact(fact_id)
    await fact_memory.delete_fact(fact_id, principal.actor[:64])
    await audit(
        access, principal, "fact.delete", f"fact {fact_id} of user {user.id}", text=fact.text
    )
    return user


async def erase(
    operations: MemoryOperations, access: AccessStore, principal: Principal, user_pk: int
) -> body.Erased:
    """An admin's erasure of a user, audited with what was removed."""
    report = erased_body(await operations.erase_user(user_pk))
    await audit(
        access,
        principal,
        "user.erase",
        f"user {user_pk} ({report.user_id!r}, tenant {report.tenant_id})",
        removed=report.removed,
    )
    return report


async def session_of_user(store: Store, user_pk: int, session_id: str) -> tuple[ChatSession, User]:
    """The session, if it is this user's; another user's is as missing as none."""
    chat, user = await store.get_session(session_id)
    if user.id != user_pk:
        raise NotFoundError("session", session_id)
    return chat, user
