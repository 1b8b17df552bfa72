"""The admin page at /admin: server-rendered HTML over the same stores as the admin API.

Browsers cannot send an Authorization header on navigation, so signing in opens a
session whose token travels in an HttpOnly, SameSite=Strict cookie scoped to /admin (see
app.access.keys); forms post back and redirect (no script is needed). In local mode no
sign-in is asked.

Every form carries a token tied to the browser's session (in local mode, to a random
cookie of its own): a page elsewhere cannot read it, so it cannot post a form that is
taken (`app.api.guard` also refuses posts from other origins). Redirects after a
form go to paths of this page only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlencode, urlsplit

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.exceptions import (
    HTTPException,
    PermissionDeniedException,
    TooManyRequestsException,
)
from litestar.params import Body, FromPath, QueryParameter
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.status_codes import HTTP_303_SEE_OTHER
from markupsafe import Markup

from app.access.keys import ADMIN_SESSION_COOKIE, AccessGate, Principal, admin_only
from app.admin.actions import correct_fact, erase, remove_fact
from app.api.admin import Deployment
from app.api.guard import CSP_NONCE
from app.api.requests import incoming_text
from retrieval.chat.search import MemorySearch
from retrieval.errors import InvalidInputError
from retrieval.facts.memory import FactMemory
from retrieval.maintenance import MemoryOperations
from storage.access import AccessRepository
from storage.admin import AdminRepository
from storage.db import Database
from storage.facts import STATUSES
from storage.sessions import SessionRepository

Form = Body(media_type=RequestEncodingType.URL_ENCODED)
CSRF_COOKIE = "memchat_csrf"
CSRF_FIELD = "csrf"
_NEW_CSRF = "memchat_new_csrf_binding"


def _back(to: str) -> Redirect:
    return Redirect(to, status_code=HTTP_303_SEE_OTHER)


def safe_back(value: str | None, default: str) -> str:
    """Where a form returns to: a path of the admin page, never another site."""
    if not value or "\\" in value or any(ord(c) < 0x20 for c in value):
        return default
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or value.startswith("//"):
        return default
    if parts.path != "/admin" and not parts.path.startswith("/admin/"):
        return default
    return value


def _cookie(key: str, value: str, request: Request[Any, Any, Any], **extra: Any) -> Cookie:
    """Secure when the browser's connection was TLS, to this server or to a trusted proxy
    (MEMCHAT_ACCESS__TRUSTED_PROXIES) in front of it."""
    gate: AccessGate = request.app.state.access_gate
    return Cookie(
        key=key,
        value=value,
        path="/admin",
        httponly=True,
        samesite="strict",
        secure=gate.proxies.is_https(request.scope),
        **extra,
    )


def _csrf_binding(request: Request[Any, Any, Any]) -> str:
    """The secret a form token is derived from: the session token when signed in with a
    key, else (local mode) a random cookie of this browser, made on its first page."""
    principal = request.user
    if isinstance(principal, Principal) and principal.key_id is not None:
        return request.cookies.get(ADMIN_SESSION_COOKIE, "")
    binding = request.cookies.get(CSRF_COOKIE) or request.scope.get("state", {}).get(_NEW_CSRF)
    if not binding:
        binding = secrets.token_urlsafe(32)
        request.scope.setdefault("state", {})[_NEW_CSRF] = binding
    return str(binding)


def csrf_token(request: Request[Any, Any, Any]) -> str:
    binding = _csrf_binding(request)
    return hmac.new(binding.encode(), b"memchat admin form", hashlib.sha256).hexdigest()


def form_token_field(context: Mapping[str, Any]) -> Markup:
    """`{{ form_token_field() }}` in a template: the hidden field every form must carry."""
    token = csrf_token(context["request"])
    return Markup(f'<input type="hidden" name="{CSRF_FIELD}" value="{token}">')


def csp_nonce(context: Mapping[str, Any]) -> str:
    """`{{ csp_nonce() }}` in a template: the nonce that lets its own style and script run
    under the page's Content-Security-Policy (made per request by `app.api.guard`)."""
    return str(context["request"].scope.get("state", {}).get(CSP_NONCE, ""))


def register_template_callables(jinja: JinjaTemplateEngine) -> None:
    jinja.register_template_callable("form_token_field", form_token_field)
    jinja.register_template_callable("csp_nonce", csp_nonce)


def check_csrf(request: Request[Any, Any, Any], data: Mapping[str, str]) -> None:
    sent = data.get(CSRF_FIELD, "")
    has_binding = request.cookies.get(ADMIN_SESSION_COOKIE) or request.cookies.get(CSRF_COOKIE)
    if not has_binding or not hmac.compare_digest(sent, csrf_token(request)):
        raise PermissionDeniedException(
            "the form's token is missing or does not match this browser's session; "
            "reload the page and send the form again"
        )


def page(
    request: Request[Any, Any, Any], name: str, context: dict[str, Any], status_code: int = 200
) -> Template:
    """A page whose forms carry this browser's token; in local mode a browser seen for
    the first time gets its form binding cookie with it."""
    _csrf_binding(request)
    binding = request.scope.get("state", {}).get(_NEW_CSRF)
    cookies = [_cookie(CSRF_COOKIE, binding, request)] if binding else []
    return Template(f"admin/{name}.html", context=context, status_code=status_code, cookies=cookies)


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
        if gate.is_local_mode:
            return _back("/admin")
        secret = (data.get("key") or "").strip()
        token = None
        if secret:
            client = gate.proxies.client_address(request.scope)
            try:
                _principal, token = await gate.sign_in(secret, _session_ttl_s(request), client)
            except TooManyRequestsException:
                raise
            except HTTPException:  # any other refusal is the same answer to a browser
                token = None
        if token is None:
            return Template(
                "admin/login.html",
                context={"error": "This is not an active admin key."},
                status_code=401,
            )
        redirect = _back("/admin")
        redirect.cookies.append(_cookie(ADMIN_SESSION_COOKIE, token, request))
        return redirect

    @post("/logout", status_code=HTTP_303_SEE_OTHER)
    async def logout(
        self, request: Request[Any, Any, Any], data: Annotated[dict[str, str], Form]
    ) -> Redirect:
        gate: AccessGate = request.app.state.access_gate
        token = request.cookies.get(ADMIN_SESSION_COOKIE)
        if token:
            # The form's token is tied to the session it ends.
            binding = hmac.new(token.encode(), b"memchat admin form", hashlib.sha256)
            if hmac.compare_digest(data.get(CSRF_FIELD, ""), binding.hexdigest()):
                await gate.sign_out(token)
        redirect = _back("/admin/login")
        redirect.cookies.append(_cookie(ADMIN_SESSION_COOKIE, "", request, max_age=0))
        return redirect


def _session_ttl_s(request: Request[Any, Any, Any]) -> float:
    return float(request.app.state.admin_session_ttl_s)


# Users shown on one page of the overview (the next page is a link away); so too a
# user's sessions on their page, and entries of the audit log.
USERS_PER_PAGE = 50
SESSIONS_PER_PAGE = 50
AUDIT_ENTRIES_PER_PAGE = 50
# 2**53 - 1: a JSON number of the schema that every client reads exactly.
MAX_ID = 2**53 - 1
# A session id as the store keeps them (a UUID, either case).
SESSION_ID_PATTERN = (
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


class AdminPageController(Controller):
    path = "/admin"
    guards = [admin_only]  # noqa: RUF012
    include_in_schema = False

    @get("/")
    async def home(
        self,
        request: Request[Any, Any, Any],
        admin: NamedDependency[AdminRepository],
        db: NamedDependency[Database],
        deployment: NamedDependency[Deployment],
        principal: NamedDependency[Principal],
        tenant: Annotated[str | None, QueryParameter(max_length=64)] = None,
        prefix: Annotated[str | None, QueryParameter(max_length=255)] = None,
        after: Annotated[int, QueryParameter(ge=0, le=MAX_ID)] = 0,
    ) -> Template:
        tenants = await admin.list_tenants_with_counts()
        chosen = next((t for t in tenants if t.name == tenant), None)
        users = await admin.list_users_with_counts(
            chosen.id if chosen else None,
            prefix=prefix or None,
            after_id=after,
            limit=USERS_PER_PAGE + 1,
        )
        more = len(users) > USERS_PER_PAGE
        return page(
            request,
            "home",
            {
                "principal": principal,
                "tenants": tenants,
                "tenant": chosen,
                "users": users[:USERS_PER_PAGE],
                "prefix": prefix or "",
                "after": after,
                "next_after": users[USERS_PER_PAGE - 1].user.id if more else None,
                "first_page": _url("/admin", tenant=chosen.name if chosen else None, prefix=prefix),
                "rows": await admin.count_rows(),
                "database_bytes": await db.size_bytes(),
                "deployment": deployment,
            },
        )

    @get("/users/{user_pk:int}")
    async def user(
        self,
        request: Request[Any, Any, Any],
        user_pk: FromPath[int],
        admin: NamedDependency[AdminRepository],
        sessions: NamedDependency[SessionRepository],
        fact_memory: NamedDependency[FactMemory],
        memory_search: NamedDependency[MemorySearch],
        principal: NamedDependency[Principal],
        q: Annotated[str | None, QueryParameter(max_length=2000)] = None,
        after: Annotated[str | None, QueryParameter(pattern=SESSION_ID_PATTERN)] = None,
    ) -> Template:
        counts = await admin.get_user_counts(user_pk)
        user = counts.user
        listed = await sessions.list_sessions_page(
            user.id, after_id=after, limit=SESSIONS_PER_PAGE + 1
        )
        more = len(listed) > SESSIONS_PER_PAGE
        here = f"/admin/users/{user.id}"
        facts, history = await fact_memory.list_facts(user.id, STATUSES, with_history=True)
        hits = []
        if q and q.strip():
            kinds = ["turn", "fact", "knowledge"]
            hits = await memory_search.search(user, q, 10, None, kinds)
        return page(
            request,
            "user",
            {
                "principal": principal,
                "counts": counts,
                "user": user,
                "sessions": listed[:SESSIONS_PER_PAGE],
                "first_sessions": _url(here, q=q) if after else None,
                "more_sessions": (
                    _url(here, q=q, after=listed[SESSIONS_PER_PAGE - 1][0].id) if more else None
                ),
                "facts": facts,
                "history": history,
                "query": q or "",
                "hits": hits,
            },
        )

    @get("/audit")
    async def audit_log(
        self,
        request: Request[Any, Any, Any],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
        before: Annotated[int | None, QueryParameter(ge=1, le=MAX_ID)] = None,
    ) -> Template:
        """Newest first, a page at a time; the older entries are a link away (keyed by
        the page's last id, so entries written meanwhile shift no page)."""
        entries = await access.list_audit(limit=AUDIT_ENTRIES_PER_PAGE + 1, before_id=before)
        more = len(entries) > AUDIT_ENTRIES_PER_PAGE
        return page(
            request,
            "audit",
            {
                "principal": principal,
                "entries": entries[:AUDIT_ENTRIES_PER_PAGE],
                "newest": "/admin/audit" if before is not None else None,
                "older": (
                    _url("/admin/audit", before=str(entries[AUDIT_ENTRIES_PER_PAGE - 1].id))
                    if more
                    else None
                ),
            },
        )

    @post("/facts/{fact_id:int}/edit", status_code=HTTP_303_SEE_OTHER)
    async def edit_fact(
        self,
        request: Request[Any, Any, Any],
        fact_id: FromPath[int],
        data: Annotated[dict[str, str], Form],
        fact_memory: NamedDependency[FactMemory],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> Redirect:
        check_csrf(request, data)
        before, user = await fact_memory.get_fact(fact_id)
        text = data.get("text")
        text = None if text is None else incoming_text(text, "text")
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
        return _back(safe_back(data.get("back"), f"/admin/users/{user.id}"))

    @post("/facts/{fact_id:int}/delete", status_code=HTTP_303_SEE_OTHER)
    async def delete_fact(
        self,
        request: Request[Any, Any, Any],
        fact_id: FromPath[int],
        data: Annotated[dict[str, str], Form],
        fact_memory: NamedDependency[FactMemory],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> Redirect:
        check_csrf(request, data)
        user = await remove_fact(fact_memory, access, principal, fact_id)
        return _back(safe_back(data.get("back"), f"/admin/users/{user.id}"))

    @post("/users/{user_pk:int}/erase", status_code=HTTP_303_SEE_OTHER)
    async def erase_user(
        self,
        request: Request[Any, Any, Any],
        user_pk: FromPath[int],
        data: Annotated[dict[str, str], Form],
        operations: NamedDependency[MemoryOperations],
        access: NamedDependency[AccessRepository],
        principal: NamedDependency[Principal],
    ) -> Redirect:
        check_csrf(request, data)
        await erase(operations, access, principal, user_pk)
        return _back("/admin")


def _url(path: str, **values: str | None) -> str:
    """A path of this page with these query values (those set)."""
    query = urlencode({name: value for name, value in values.items() if value})
    return f"{path}?{query}" if query else path


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
