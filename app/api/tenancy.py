"""Objects addressed by id are looked up within the caller's tenant.

Another tenant's session, fact or document is answered exactly like a missing one (the
same 404 and detail), so ids reveal nothing across tenants.
"""

from __future__ import annotations

from app.access.keys import Principal
from storage.errors import NotFoundError
from storage.models import ChatSession, Fact, User
from storage.repository import Store


async def session_of(
    store: Store, principal: Principal, session_id: str
) -> tuple[ChatSession, User]:
    chat, user = await store.get_session(session_id)
    if user.tenant_id != principal.tenant_id:
        raise NotFoundError("session", session_id)
    return chat, user


def check_fact(principal: Principal, fact: Fact, user: User) -> None:
    if user.tenant_id != principal.tenant_id:
        raise NotFoundError("fact", fact.id)
