"""Memory search across all sessions of a user."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_200_OK

from app import schemas
from app.routes.body import strict_body
from app.routes.problems import problems
from retrieval.chat import ChatService, SearchHit, as_utc
from retrieval.facts.service import FactHit, FactMemory
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
        fact_memory: NamedDependency[FactMemory],
    ) -> schemas.SearchResponse:
        """Past turns (`kind: turn`, the default) and key facts (`kind: fact`) of one user,
        ranked together by similarity to the query."""
        data = await strict_body(request, schemas.SearchRequest)
        user = await store.get_user(data.user_id)
        if data.session_id is not None:
            _chat, owner = await store.get_session(data.session_id)
            if owner.id != user.id:
                # Another user's session is as unknown to this user as a missing one.
                raise NotFoundError("session", data.session_id)
        kinds = set(data.kinds or ["turn"])
        results: list[schemas.SearchResult] = []
        if "turn" in kinds:
            hits = await chat_service.search(user, data.query, data.k, data.session_id)
            results += [_turn_result(hit) for hit in hits]
        if "fact" in kinds:
            vector = await chat_service.embed_query(data.query)
            results += [
                _fact_result(hit) for hit in await fact_memory.search(user.id, vector, data.k)
            ]
        results.sort(key=lambda r: -r.score)
        return schemas.SearchResponse(results=results[: data.k])


def _turn_result(hit: SearchHit) -> schemas.SearchResult:
    return schemas.SearchResult(
        kind="turn",
        id=hit.turn.id,
        session_id=hit.turn.session_id,
        external_id=hit.turn.external_id,
        role=hit.turn.role,
        name=hit.turn.name,
        text=hit.turn.content,
        score=round(hit.score, 6),
        created_at=hit.turn.created_at,
    )


def _fact_result(hit: FactHit) -> schemas.SearchResult:
    return schemas.SearchResult(
        kind="fact",
        id=hit.fact.id,
        text=hit.fact.text,
        score=round(hit.score, 6),
        created_at=as_utc(hit.fact.valid_from),
        category=hit.fact.category,
        source_message_ids=list(hit.fact.source_message_ids),
    )
