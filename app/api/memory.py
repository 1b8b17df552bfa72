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
from app.api.tenancy import session_of
from retrieval.chat.service import ChatService
from storage.errors import NotFoundError
from storage.repository import Store


class MemoryController(Controller):
    path = "/v1/memory"
    tags = ["memory"]  # noqa: RUF012

    @post("/search", status_code=HTTP_200_OK, responses=problems(400, 404, 413, 422, 503))
    async def search(
        self,
        request: Request[Any, Any, Any],
        store: NamedDependency[Store],
        chat_service: NamedDependency[ChatService],
        principal: NamedDependency[Principal],
    ) -> schemas.SearchResponse:
        """Past turns (`kind: turn`, the default) and key facts (`kind: fact`) of one user,
        ranked together by similarity to the query."""
        data = await strict_body(request, schemas.SearchRequest)
        user = await store.get_user(data.user_id, tenant_id=principal.tenant_id)
        if data.session_id is not None:
            _chat, owner = await session_of(store, principal, data.session_id)
            if owner.id != user.id:
                # Another user's session is as unknown to this user as a missing one.
                raise NotFoundError("session", data.session_id)
        kinds = data.kinds or ["turn"]
        hits = await chat_service.search_all(user, data.query, data.k, data.session_id, kinds)
        return schemas.SearchResponse(results=[search_result_body(hit) for hit in hits])
