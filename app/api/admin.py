"""The admin API under /admin/v1: every tenant's users and what is stored about them.

Only admin keys (or local mode) get here; every change is written to the audit log with
the key that made it. Users are addressed by their internal id, as one client's user id
may exist in several tenants.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from litestar import Controller, Request, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath, QueryParameter
from litestar.status_codes import HTTP_200_OK

from app.access.keys import Principal, admin_only
from app.admin.actions import audit, correct_fact, erase, remove_fact, session_of_user
from app.api import admin_schemas as body
from app.api import schemas
from app.api.bodies import (
    admin_message_body,
    document_body,
    erased_body,
    fact_body,
    message_body,
    search_result_body,
    session_body,
    summary_body,
    user_body,
)
from app.api.problems import problems
from app.api.requests import strict_body
from retrieval.chat.search import MemorySearch
from retrieval.chat.turn_report import report_of_stored
from retrieval.facts.memory import FactMemory
from retrieval.maintenance import MemoryOperations
from retrieval.search.memory import TurnMemory
from storage.access import AccessRepository
from storage.admin import AdminRepository
from storage.db import Database
from storage.errors import NotFoundError
from storage.facts import STATUSES
from storage.knowledge import KnowledgeRepository, scope_of
from storage.messages import MessageRepository
from storage.sessions import SessionRepository
from storage.summaries import SummaryRepository
from storage.users import UserRepository

UserPk = FromPath[int]


@dataclass(frozen=True, slots=True)
class Deployment:
    """What the statistics page says of the running configuration."""

    index_kind: str
    index_dir: Path
    embedder: str
    engine: str
    second_embedder: str | None = None
    # The second dense list's state (`app.api.health.describe_backfill`).
    second_index: str | None = None


def directory_bytes(directory: Path) -> int | None:
    if not directory.is_dir():
        return None
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


class AdminController(Controller):
    path = "/admin/v1"
    tags = ["admin"]  # noqa: RUF012
    guards = [admin_only]  # noqa: RUF012

    @get("/tenants", responses=problems(401, 403, 503))
    async def list_tenants(self, admin: NamedDependency[AdminRepository]) -> body.TenantList:
        rows = await admin.list_tenants_with_counts()
        return body.TenantList(
            tenants=[body.Tenant(t.id, t.name, t.num_users, t.num_keys) for t in rows]
        )

    @get("/users", responses=problems(401, 403, 404, 422, 503))
    async def list_users(
        self,
        admin: NamedDependency[AdminRepository],
        access: NamedDependency[AccessRepository],
        tenant: Annotated[str | None, QueryParameter(min_length=1, max_length=64)] = None,
        prefix: Annotated[str | None, QueryParameter(min_length=1, max_length=255)] = None,
        # 2**53 - 1: a JSON number of the schema that every client reads exactly.
        after: Annotated[int, QueryParameter(ge=0, le=2**53 - 1)] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=1000)] = 1000,
    ) -> body.UserList:
        """Users (every tenant's, or one's; those whose id starts with `prefix`) by
        internal id, with the size of their memory: a page of at most `limit` after the
        id `after`, and where the next page starts."""
        tenant_id = (await access.get_tenant(tenant)).id if tenant is not None else None
        rows = await admin.list_users_with_counts(
            tenant_id, prefix=prefix, after_id=after, limit=limit + 1
        )
        more = len(rows) > limit
        return body.UserList(
            users=[user_body(r) for r in rows[:limit]],
            next_after=rows[limit - 1].user.id if more else None,
        )

    @get("/users/{user_pk:int}", responses=problems(401, 403, 404, 503))
    async def get_user(
        self,
        user_pk: UserPk,
        admin: NamedDependency[AdminRepository],
        sessions: NamedDependency[SessionRepository],
        turn_memory: NamedDependency[TurnMemory],
    ) -> body.UserDetail:
        counts = await admin.get_user_counts(user_pk)
        user = counts.user
        found = await sessions.list_sessions(user.external_id, tenant_id=user.tenant_id)
        await turn_memory.ensure_scope(user_pk)
        num_vectors, _num_terms = await turn_memory.scope_sizes(user_pk)
        return body.UserDetail(
            user=user_body(counts),
            sessions=[session_body(c, user, n) for c, n in found],
            num_vectors=num_vectors,
        )

    @get(
        "/users/{user_pk:int}/sessions/{session_id:str}/messages",
        responses=problems(401, 403, 404, 422, 503),
    )
    async def list_messages(
        self,
        user_pk: UserPk,
        session_id: FromPath[str],
        sessions: NamedDependency[SessionRepository],
        messages: NamedDependency[MessageRepository],
        after_seq: Annotated[int, QueryParameter(ge=0, le=2**31 - 1)] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=10_000)] = 1000,
    ) -> body.AdminMessageList:
        """A conversation with, for each user turn, the context it was sent with."""
        await session_of_user(sessions, user_pk, session_id)
        rows = await messages.list_messages(session_id, limit=limit, after_seq=after_seq)
        return body.AdminMessageList(messages=[admin_message_body(r) for r in rows])

    @get(
        "/users/{user_pk:int}/sessions/{session_id:str}/turns/{message_id:int}",
        responses=problems(401, 403, 404, 503),
    )
    async def get_turn(
        self,
        user_pk: UserPk,
        session_id: FromPath[str],
        message_id: FromPath[int],
        sessions: NamedDependency[SessionRepository],
        messages: NamedDependency[MessageRepository],
    ) -> body.AdminTurn:
        """A user turn, its reply and the report the reply keeps; 404 for a message the
        session does not hold, or one whose turn kept no report (imported history)."""
        await session_of_user(sessions, user_pk, session_id)
        found = await messages.get_reported_turn(session_id, message_id)
        report = report_of_stored(found.report)
        if report is None or found.reply is None:
            raise NotFoundError("turn report", message_id)
        return body.AdminTurn(message_body(found.message), message_body(found.reply), report)

    @get("/users/{user_pk:int}/facts", responses=problems(401, 403, 404, 422, 503))
    async def list_facts(
        self,
        user_pk: UserPk,
        users: NamedDependency[UserRepository],
        fact_memory: NamedDependency[FactMemory],
        status: Annotated[Literal["active", "superseded", "deleted", "all"], QueryParameter()] = (
            "all"
        ),
    ) -> schemas.FactList:
        """The user's facts with their whole history of changes."""
        user = await users.get_user_by_pk(user_pk)
        statuses = STATUSES if status == "all" else (status,)
        facts, history = await fact_memory.list_facts(user.id, statuses, with_history=True)
        return schemas.FactList(
            facts=[fact_body(f, user.external_id, history[f.id]) for f in facts]
        )

    @get("/users/{user_pk:int}/summaries", responses=problems(401, 403, 404, 503))
    async def list_summaries(
        self,
        user_pk: UserPk,
        users: NamedDependency[UserRepository],
        sessions: NamedDependency[SessionRepository],
        summaries: NamedDependency[SummaryRepository],
    ) -> body.UserSummaries:
        user = await users.get_user_by_pk(user_pk)
        found = []
        for chat, _num in await sessions.list_sessions(user.external_id, tenant_id=user.tenant_id):
            rows = await summaries.list_summaries(chat.id)
            found.append(body.SessionSummaries(chat.id, [summary_body(r) for r in rows]))
        return body.UserSummaries(sessions=found)

    @get("/users/{user_pk:int}/knowledge", responses=problems(401, 403, 404, 503))
    async def list_knowledge(
        self,
        user_pk: UserPk,
        users: NamedDependency[UserRepository],
        documents: NamedDependency[KnowledgeRepository],
    ) -> schemas.KnowledgeDocumentList:
        """The user's own documents (their tenant's shared ones are not theirs to erase)."""
        user = await users.get_user_by_pk(user_pk)
        rows = await documents.list_documents(scope_of(user.tenant_id, user.id))
        return schemas.KnowledgeDocumentList(
            documents=[document_body(d, user.external_id) for d in rows]
        )

    @post(
        "/users/{user_pk:int}/search",
        status_code=HTTP_200_OK,
        responses=problems(400, 401, 403, 404, 422, 503),
    )
    async def search(
        self,
        user_pk: UserPk,
        request: Request[Any, Any, Any],
        users: NamedDependency[UserRepository],
        memory_search: NamedDependency[MemorySearch],
    ) -> schemas.SearchResponse:
        """What the user's memory answers to a query, with each hit's score."""
        data = await strict_body(request, body.AdminSearch)
        user = await users.get_user_by_pk(user_pk)
        kinds = data.kinds or ["turn", "fact", "knowledge"]
        hits = await memory_search.search(user, data.query, data.k, None, kinds)
        return schemas.SearchResponse(results=[search_result_body(h) for h in hits])

    @patch("/facts/{fact_id:int}", responses=problems(400, 401, 403, 404, 409, 422, 503))
    async def update_fact(
        self,
        fact_id: FromPath[int],
        request: Request[Any, Any, Any],
        fact_memory: NamedDependency[FactMemory],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> schemas.Fact:
        """Correct a fact's text, pin or unpin it, or change its priority."""
        data = await strict_body(request, schemas.FactUpdate)
        before, user = await fact_memory.get_fact(fact_id)
        fact = await correct_fact(
            fact_memory,
            access,
            principal,
            before,
            user,
            text=data.text,
            is_pinned=data.pinned,
            priority=data.priority,
        )
        return fact_body(fact, user.external_id)

    @delete("/facts/{fact_id:int}", responses=problems(401, 403, 404, 503))
    async def delete_fact(
        self,
        fact_id: FromPath[int],
        fact_memory: NamedDependency[FactMemory],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> None:
        await remove_fact(fact_memory, access, principal, fact_id)

    @delete("/users/{user_pk:int}", status_code=HTTP_200_OK, responses=problems(401, 403, 404, 503))
    async def erase_user(
        self,
        user_pk: UserPk,
        operations: NamedDependency[MemoryOperations],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> body.Erased:
        """Erase the user: every row in SQL and every vector, then what was removed."""
        return erased_body(await erase(operations, access, principal, user_pk))

    @post(
        "/users/{user_pk:int}/reindex",
        status_code=HTTP_200_OK,
        responses=problems(401, 403, 404, 503),
    )
    async def reindex_user(
        self,
        user_pk: UserPk,
        operations: NamedDependency[MemoryOperations],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> body.Reindexed:
        done = await operations.reindex_user(user_pk)
        await audit(
            access,
            principal,
            "user.reindex",
            f"user {user_pk}",
            num_turns=done.num_turns,
            num_chunks=done.num_chunks,
        )
        return body.Reindexed(done.num_turns, done.num_chunks)

    @post("/reindex", status_code=HTTP_200_OK, responses=problems(401, 403, 503))
    async def reindex_all(
        self,
        operations: NamedDependency[MemoryOperations],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> body.Reindexed:
        """Re-embed every turn and knowledge chunk (long on big stores; requests wait)."""
        done = await operations.reindex_all()
        await audit(
            access,
            principal,
            "reindex.all",
            "everything",
            num_turns=done.num_turns,
            num_chunks=done.num_chunks,
        )
        return body.Reindexed(done.num_turns, done.num_chunks)

    @get("/stats", responses=problems(401, 403, 503))
    async def statistics(
        self,
        admin: NamedDependency[AdminRepository],
        db: NamedDependency[Database],
        deployment: NamedDependency[Deployment],
    ) -> body.Statistics:
        return body.Statistics(
            rows=await admin.count_rows(),
            database_bytes=await db.size_bytes(),
            index_kind=deployment.index_kind,
            index_bytes=directory_bytes(deployment.index_dir),
            embedder=deployment.embedder,
            engine=deployment.engine,
            second_embedder=deployment.second_embedder,
            second_index=deployment.second_index,
        )

    @get("/audit", responses=problems(401, 403, 422, 503))
    async def audit_log(
        self,
        access: NamedDependency[AccessRepository],
        limit: Annotated[int, QueryParameter(ge=1, le=1000)] = 100,
        before_id: Annotated[int | None, QueryParameter(ge=1, le=2**62)] = None,
    ) -> body.AuditLog:
        """Admin changes, newest first; page back with `before_id`."""
        rows = await access.list_audit(limit=limit, before_id=before_id)
        return body.AuditLog(entries=rows)
