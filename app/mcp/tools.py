"""What each MCP tool does, over the runtime's use cases, for one principal.

Each method is its REST route's work (app/api/memory.py, facts.py, sessions.py): the same
use cases and repositories, the same tenant checks (another tenant's session or fact is
as missing as none) and the same bodies. Two differences suit an agent: a user memchat
has not met yet has an empty memory (no "user not found"), and a session's turns are
its most recent ones. Text arguments are normalised as JSON bodies are
(`app.api.requests.incoming_text`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from app.access.keys import Principal
from app.api import schemas
from app.api.bodies import fact_body, message_body, search_result_body, session_body
from app.api.errors import ID_RULE
from app.api.requests import incoming_text
from app.api.tenancy import check_fact
from app.runtime import Runtime
from retrieval.chat.sessions import session_of_tenant
from retrieval.errors import InvalidInputError
from storage.errors import NotFoundError
from storage.facts import STATUSES
from storage.records import User

MCP_ACTOR = "mcp"
ALL_KINDS = ("turn", "fact", "knowledge")
_USER_ID = re.compile(schemas.USER_ID_PATTERN)


def check_user_id(user_id: str) -> str:
    """The user id as the REST API takes it: normalised like any text a client sends,
    then held to the rule for ids (they appear in its paths)."""
    user_id = incoming_text(user_id, "user_id")
    if not _USER_ID.search(user_id):
        raise InvalidInputError("user_id", ID_RULE)
    return user_id


def _optional_text(value: str | None, field: str) -> str | None:
    return None if value is None else incoming_text(value, field)


class MemoryTools:
    """The use cases behind the MCP tools; `runtime` gives the service's parts once
    they are loaded (the app's lifespan, or the stdio server's)."""

    def __init__(self, runtime: Callable[[], Runtime]) -> None:
        self._runtime = runtime

    async def _user_or_none(self, principal: Principal, user_id: str) -> User | None:
        user_id = check_user_id(user_id)
        users = self._runtime().repositories.users
        return await users.get_user_or_none(user_id, tenant_id=principal.tenant_id)

    async def search_memory(
        self,
        principal: Principal,
        user_id: str,
        query: str,
        k: int,
        session_id: str | None,
        kinds: Sequence[str],
    ) -> schemas.SearchResponse:
        runtime = self._runtime()
        user = await self._user_or_none(principal, user_id)
        query = incoming_text(query, "query")
        session_id = _optional_text(session_id, "session_id")
        if session_id is not None:
            state = await session_of_tenant(
                runtime.repositories.sessions, session_id, principal.tenant_id
            )
            if user is None or state.user.id != user.id:
                # Another user's session is as unknown to this user as a missing one.
                raise NotFoundError("session", session_id)
        if user is None:
            return schemas.SearchResponse(results=[])
        hits = await runtime.search.search(user, query, k, session_id, kinds)
        return schemas.SearchResponse(results=[search_result_body(hit) for hit in hits])

    async def remember(
        self,
        principal: Principal,
        user_id: str,
        text: str,
        *,
        category: str | None,
        subject: str | None,
        pinned: bool | None,
        priority: int | None,
    ) -> schemas.Fact:
        user_id = check_user_id(user_id)
        text = incoming_text(text, "text")
        subject = _optional_text(subject, "subject")
        runtime = self._runtime()
        user = await runtime.repositories.users.ensure_user(user_id, tenant_id=principal.tenant_id)
        fact = await runtime.facts.add_fact(
            user.id,
            text,
            category=category,
            subject=subject,
            is_pinned=pinned,
            priority=priority,
            actor=MCP_ACTOR,
        )
        return fact_body(fact, user.external_id)

    async def list_facts(
        self, principal: Principal, user_id: str, status: str, *, with_history: bool
    ) -> schemas.FactList:
        user = await self._user_or_none(principal, user_id)
        if user is None:
            return schemas.FactList(facts=[])
        statuses = STATUSES if status == "all" else (status,)
        facts, history = await self._runtime().facts.list_facts(
            user.id, statuses, with_history=with_history
        )
        return schemas.FactList(
            facts=[
                fact_body(f, user.external_id, history[f.id] if with_history else None)
                for f in facts
            ]
        )

    async def correct_fact(
        self,
        principal: Principal,
        fact_id: int,
        *,
        text: str | None,
        pinned: bool | None,
        priority: int | None,
    ) -> schemas.Fact:
        text = _optional_text(text, "text")
        facts = self._runtime().facts
        current, user = await facts.get_fact(fact_id)
        check_fact(principal, current, user)
        fact = await facts.update_fact(
            fact_id, text=text, is_pinned=pinned, priority=priority, actor=MCP_ACTOR
        )
        return fact_body(fact, user.external_id)

    async def forget_fact(self, principal: Principal, fact_id: int) -> schemas.Fact:
        facts = self._runtime().facts
        fact, user = await facts.get_fact(fact_id)
        check_fact(principal, fact, user)
        return fact_body(await facts.delete_fact(fact_id, MCP_ACTOR), user.external_id)

    async def list_sessions(self, principal: Principal, user_id: str) -> schemas.SessionList:
        user = await self._user_or_none(principal, user_id)
        if user is None:
            return schemas.SessionList(sessions=[])
        sessions = self._runtime().repositories.sessions
        rows = await sessions.list_sessions(user.external_id, tenant_id=principal.tenant_id)
        return schemas.SessionList(sessions=[session_body(c, user, n) for c, n in rows])

    async def recent_turns(
        self, principal: Principal, session_id: str, limit: int
    ) -> schemas.MessageList:
        session_id = incoming_text(session_id, "session_id")
        repositories = self._runtime().repositories
        await session_of_tenant(repositories.sessions, session_id, principal.tenant_id)
        rows = await repositories.messages.list_last_messages(session_id, limit)
        return schemas.MessageList(messages=[message_body(r) for r in rows])
