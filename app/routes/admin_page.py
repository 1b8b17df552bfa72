"""The admin page at /admin: server-rendered HTML over the same stores as the admin API.

Browsers cannot send an Authorization header on navigation, so signing in stores the
admin key in an HttpOnly, SameSite=Strict cookie scoped to /admin (see app.access); forms
post back and redirect (no script is needed). In local mode no sign-in is asked.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException
from litestar.params import Body, FromPath, QueryParameter
from litestar.response import Redirect, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.access import ADMIN_COOKIE, AccessGate, Principal, admin_only
from app.routes.admin import correct_fact, erase, remove_fact, session_of_user
from retrieval.chat import ChatService
from retrieval.errors import InvalidInputError
from retrieval.facts.service import FactMemory
from retrieval.operations import MemoryOperations
from storage.access import AccessStore
from storage.facts import STATUSES
from storage.repository import Store
from storage.summaries import SummaryStore

Form = Body(media_type=RequestEncodingType.URL_ENCODED)


def _back(to: str) -> Redirect:
    return Redirect(to, status_code=HTTP_303_SEE_OTHER)


class AdminLoginController(Controller):
    """Signing in and out: public, so that a browser without a key can reach the form."""

    path = "/admin"
    include_in_schema = False

    @get("/login")
    async def login_form(self) -> Template:
        return Template("admin/login.html", context={"error": None})

    @post("/login", status_code=HTTP_303_SEE_OTHER)
    async def login(
        self, request: Request[Any, Any, Any], data: Annotated[dict[str, str], Form]
    ) -> Redirect | Template:
        gate: AccessGate = request.app.state.access_gate
        secret = (data.get("key") or "").strip()
        try:
            principal = await gate.authenticate(secret or None)
        except HTTPException:  # any refusal is the same answer to a browser
            principal = None
        if principal is None or not principal.is_admin:
            return Template(
                "admin/login.html",
                context={"error": "This is not an active admin key."},
                status_code=401,
            )
        redirect = _back("/admin")
        if secret:
            redirect.cookies.append(
                Cookie(
                    key=ADMIN_COOKIE,
                    value=secret,
                    path="/admin",
                    httponly=True,
                    samesite="strict",
                    secure=request.url.scheme == "https",
                )
            )
        return redirect

    @post("/logout", status_code=HTTP_303_SEE_OTHER)
    async def logout(self) -> Redirect:
        redirect = _back("/admin/login")
        redirect.cookies.append(Cookie(key=ADMIN_COOKIE, value="", path="/admin", max_age=0))
        return redirect


class AdminPageController(Controller):
    path = "/admin"
    guards = [admin_only]  # noqa: RUF012
    include_in_schema = False

    @get("/")
    async def home(
        self,
        operations: NamedDependency[MemoryOperations],
        principal: NamedDependency[Principal],
        tenant: Annotated[str | None, QueryParameter(max_length=64)] = None,
    ) -> Template:
        store = operations.store
        tenants = await store.list_tenants_with_counts()
        chosen = next((t for t in tenants if t.name == tenant), None)
        users = await store.list_users_with_counts(chosen.id if chosen else None)
        return Template(
            "admin/home.html",
            context={
                "principal": principal,
                "tenants": tenants,
                "tenant": chosen,
                "users": users,
                "rows": await store.count_rows(),
                "database_bytes": await store.database_bytes(),
            },
        )

    @get("/users/{user_pk:int}")
    async def user(
        self,
        user_pk: FromPath[int],
        operations: NamedDependency[MemoryOperations],
        fact_memory: NamedDependency[FactMemory],
        chat_service: NamedDependency[ChatService],
        principal: NamedDependency[Principal],
        q: Annotated[str | None, QueryParameter(max_length=2000)] = None,
    ) -> Template:
        counts = await operations.store.get_user_counts(user_pk)
        user = counts.user
        sessions = await operations.store.list_sessions(user.external_id, tenant_id=user.tenant_id)
        facts, history = await fact_memory.list_facts(user.id, STATUSES, with_history=True)
        hits = []
        if q and q.strip():
            kinds = ["turn", "fact", "knowledge"]
            hits = await chat_service.search_all(user, q, 10, None, kinds)
        return Template(
            "admin/user.html",
            context={
                "principal": principal,
                "counts": counts,
                "user": user,
                "sessions": sessions,
                "facts": facts,
                "history": history,
                "query": q or "",
                "hits": hits,
            },
        )

    @get("/users/{user_pk:int}/sessions/{session_id:str}")
    async def conversation(
        self,
        user_pk: FromPath[int],
        session_id: FromPath[str],
        store: NamedDependency[Store],
        fact_memory: NamedDependency[FactMemory],
        summaries: NamedDependency[SummaryStore],
        principal: NamedDependency[Principal],
    ) -> Template:
        """A conversation beside the facts and summaries derived from it; each user turn
        shows the memories, knowledge and facts it was sent with."""
        chat, user = await session_of_user(store, user_pk, session_id)
        messages = await store.list_messages(session_id, limit=10_000, after_seq=0)
        memory_ids = {i for m in messages for i in (m.context_note_ids or [])}
        memories = {m.id: m for m in await store.list_messages_by_id(user.id, sorted(memory_ids))}
        message_ids = {m.id for m in messages}
        facts, history = await fact_memory.list_facts(user.id, STATUSES, with_history=True)
        derived = [f for f in facts if message_ids & set(f.source_message_ids or [])]
        return Template(
            "admin/conversation.html",
            context={
                "principal": principal,
                "user": user,
                "chat": chat,
                "messages": messages,
                "memories": memories,
                "facts": derived,
                "history": history,
                "summaries": await summaries.list_summaries(session_id),
            },
        )

    @get("/audit")
    async def audit_log(
        self, access: NamedDependency[AccessStore], principal: NamedDependency[Principal]
    ) -> Template:
        entries = await access.list_audit(limit=200)
        return Template("admin/audit.html", context={"principal": principal, "entries": entries})

    @post("/facts/{fact_id:int}/edit", status_code=HTTP_303_SEE_OTHER)
    async def edit_fact(
        self,
        fact_id: FromPath[int],
        data: Annotated[dict[str, str], Form],
        fact_memory: NamedDependency[FactMemory],
        access: NamedDependency[AccessStore],
        principal: NamedDependency[Principal],
    ) -> Redirect:
        before, user = await fact_memory.store.get_fact(fact_id)
        text = data.get("text")
        priority = _priority(data.get("priority"))
        pinned = {"pin": True, "unpin": False}.get(data.get("action", ""))
        await correct_fact(
            fact_memory,
            access,
            principal,
            before,
            user,
            text=text if text and text != before.text else None,
            is_pinned=pinned,
            priority=priority,
        )
        return _back(data.get("back") or f"/admin/users/{user.id}")

    @post("/facts/{fact_id:int}/delete", status_code=HTTP_303_SEE_OTHER)
    async def delete_fact(
        self,
        fact_id: FromPath[int],
        data: Annotated[dict[str, str], Form],
        fact_memory: NamedDependency[FactMemory],
        access: NamedDependency[AccessStore],
        principal: NamedDependency[Principal],
    ) -> Redirect:
        user = await remove_fact(fact_memory, access, principal, fact_id)
        return _back(data.get("back") or f"/admin/users/{user.id}")

    @post("/users/{user_pk:int}/erase", status_code=HTTP_303_SEE_OTHER)
    async def erase_user(
        self,
        user_pk: FromPath[int],
        operations: NamedDependency[MemoryOperations],
        access: NamedDependency[AccessStore],
        principal: NamedDependency[Principal],
    ) -> Redirect:
        await erase(operations, access, principal, user_pk)
        return _back("/admin")


def _priority(value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        priority = int(value)
    except ValueError as exc:
        raise InvalidInputError("priority", "a whole number from -1000 to 1000") from exc
    if not -1000 <= priority <= 1000:
        raise InvalidInputError("priority", "a whole number from -1000 to 1000")
    return priority
