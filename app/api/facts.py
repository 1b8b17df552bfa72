"""Key facts of a user: list (with history), state, correct, delete."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Controller, Request, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath, Parameter, QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.access.keys import Principal
from app.api import schemas
from app.api.bodies import fact_body
from app.api.problems import problems
from app.api.requests import strict_body
from app.api.schemas import USER_ID_PATTERN
from app.api.tenancy import check_fact
from retrieval.facts.memory import FactMemory
from storage.facts import STATUSES
from storage.users import UserRepository

API_ACTOR = "api"
UserIdPath = Annotated[str, Parameter(min_length=1, max_length=255, pattern=USER_ID_PATTERN)]
FactIdPath = FromPath[int]


class FactController(Controller):
    tags = ["facts"]  # noqa: RUF012

    @get("/v1/users/{user_id:str}/facts", responses=problems(400, 404, 422, 503))
    async def list_facts(
        self,
        user_id: UserIdPath,
        users: NamedDependency[UserRepository],
        fact_memory: NamedDependency[FactMemory],
        principal: NamedDependency[Principal],
        include: Annotated[Literal["history"] | None, QueryParameter()] = None,
        status: Annotated[Literal["active", "superseded", "deleted", "all"], QueryParameter()] = (
            "active"
        ),
    ) -> schemas.FactList:
        user = await users.get_user(user_id, tenant_id=principal.tenant_id)
        statuses = STATUSES if status == "all" else (status,)
        with_history = include == "history"
        facts, history = await fact_memory.list_facts(user.id, statuses, with_history=with_history)
        return schemas.FactList(
            facts=[
                fact_body(f, user.external_id, history[f.id] if with_history else None)
                for f in facts
            ]
        )

    @post(
        "/v1/users/{user_id:str}/facts",
        status_code=HTTP_201_CREATED,
        responses=problems(400, 413, 422, 503),
    )
    async def create_fact(
        self,
        user_id: UserIdPath,
        request: Request[Any, Any, Any],
        users: NamedDependency[UserRepository],
        fact_memory: NamedDependency[FactMemory],
        principal: NamedDependency[Principal],
    ) -> schemas.Fact:
        data = await strict_body(request, schemas.FactCreate)
        user = await users.ensure_user(user_id, tenant_id=principal.tenant_id)
        fact = await fact_memory.add_fact(
            user.id,
            data.text,
            category=data.category,
            subject=data.subject,
            is_pinned=data.pinned,
            priority=data.priority,
            actor=API_ACTOR,
        )
        return fact_body(fact, user.external_id)

    @patch("/v1/facts/{fact_id:int}", responses=problems(400, 404, 409, 413, 422, 503))
    async def update_fact(
        self,
        fact_id: FactIdPath,
        request: Request[Any, Any, Any],
        fact_memory: NamedDependency[FactMemory],
        principal: NamedDependency[Principal],
    ) -> schemas.Fact:
        check_fact(principal, *await fact_memory.get_fact(fact_id))
        data = await strict_body(request, schemas.FactUpdate)
        fact = await fact_memory.update_fact(
            fact_id, text=data.text, is_pinned=data.pinned, priority=data.priority, actor=API_ACTOR
        )
        _fact, user = await fact_memory.get_fact(fact.id)
        return fact_body(fact, user.external_id)

    @delete(
        "/v1/facts/{fact_id:int}", status_code=HTTP_204_NO_CONTENT, responses=problems(404, 503)
    )
    async def delete_fact(
        self,
        fact_id: FactIdPath,
        fact_memory: NamedDependency[FactMemory],
        principal: NamedDependency[Principal],
    ) -> None:
        check_fact(principal, *await fact_memory.get_fact(fact_id))
        await fact_memory.delete_fact(fact_id, API_ACTOR)
