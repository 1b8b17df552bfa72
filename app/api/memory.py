"""Memory search across all sessions of a user."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_200_OK

from app.access.keys import Principal
from app.api import schemas
from app.api.bodies import search_result_body
from app.api.problems import problems
from app.api.requests import strict_body
from retrieval.chat.search import MemorySearch
from retrieval.chat.sessions import session_of_tenant
from storage.errors import NotFoundError
from storage.sessions import SessionRepository
from storage.users import UserRepository


class MemoryController(Controller):
    path = "/v1/memory"
    tags = ["memory"]  # noqa: RUF012

    @post("/search", status_code=HTTP_200_OK, responses=problems(400, 404, 413, 422, 503))
    async def search(
        self,
        request: Request[Any, Any, Any],
        users: NamedDependency[UserRepository],
        sessions: NamedDependency[SessionRepository],
        memory_search: NamedDependency[MemorySearch],
        principal: NamedDependency[Principal],
    ) -> schemas.SearchResponse:
        """Past turns (`kind: turn`, the default) and key facts (`kind: fact`) of one user,
        ranked together by similarity to the query."""
        data = await strict_body(request, schemas.SearchRequest)
        user = await users.get_user(data.user_id, tenant_id=principal.tenant_id)
        if data.session_id is not None:
            state = await session_of_tenant(sessions, data.session_id, principal.tenant_id)
            if state.user.id != user.id:
                # Another user's session is as unknown to this user as a missing one.
                raise NotFoundError("session", data.session_id)
        kinds = data.kinds or ["turn"]
        hits = await memory_search.search(user, data.query, data.k, data.session_id, kinds)
        return schemas.SearchResponse(results=[search_result_body(hit) for hit in hits])
