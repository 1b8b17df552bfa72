"""API keys, tenants and local mode, on SQLite and PostgreSQL: who may see what.

Two tenants each get a key; everything one stores must be invisible to the other, and
asking for it must look exactly like asking for something that does not exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from litestar.testing import AsyncTestClient

from app.access.keys import LocalModeRefusedError
from app.access.rate_limits import RateLimiter
from app.factory import create_app
from app.settings import AccessSettings, Settings
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine


@dataclass(frozen=True)
class Keys:
    a: str
    b: str
    admin: str
    limited: str
    revoked: str


async def make_keys(url: str) -> Keys:
    engine = create_engine(url)
    access = AccessRepository(Database(engine))
    try:
        _, a = await access.create_key("acme", "acme app")
        _, b = await access.create_key("globex", "globex app")
        _, admin = await access.create_key("ops", "ops", is_admin=True)
        _, limited = await access.create_key("acme", "slow", requests_per_minute=2)
        revoked_key, revoked = await access.create_key("acme", "old")
        await access.revoke_key(revoked_key.id)
    finally:
        await engine.dispose()
    return Keys(a, b, admin, limited, revoked)


@pytest.fixture
async def keys(database_url: str) -> Keys:
    return await make_keys(database_url)


@pytest.fixture
async def client(settings: Settings, keys: Keys) -> AsyncIterator[AsyncTestClient]:
    engine = ScriptedEngine(["Noted."] * 20)
    app = create_app(settings, embedder=HashEmbedder(), engine=engine)
    async with local_client(app) as test_client:
        yield test_client


def refused(response, status: int, detail: str) -> None:
    """A problem-details answer whose detail starts with `detail` (404s: is exactly it)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    if status == 404:
        assert body["detail"] == detail
    else:
        assert body["detail"].startswith(detail), body["detail"]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_without_a_key_outside_local_mode_every_api_route_is_401(
    client: AsyncTestClient, keys: Keys
) -> None:
    for method, path in [
        ("GET", "/v1/sessions?user_id=alice"),
        ("POST", "/v1/sessions"),
        ("POST", "/v1/memory/search"),
        ("GET", "/v1/knowledge"),
        ("GET", "/v1/users/alice/facts"),
        ("GET", "/admin/v1/tenants"),
    ]:
        response = await client.request(method, path, json={"user_id": "alice"})
        refused(response, 401, "an API key is required")
        assert response.headers["www-authenticate"].startswith("Bearer")
    wrong = await client.get("/v1/knowledge", headers=bearer("mck_not-a-key"))
    refused(wrong, 401, "unknown or revoked API key")
    revoked = await client.get("/v1/knowledge", headers=bearer(keys.revoked))
    refused(revoked, 401, "unknown or revoked API key")
    basic = await client.get("/v1/knowledge", headers={"Authorization": "Basic YWxpY2U6eA=="})
    refused(basic, 401, "send the API key as `Authorization: Bearer <key>`")
    # Probes, metrics and the API description stay open.
    for path in ("/healthz", "/readyz", "/metrics", "/schema/openapi.json"):
        assert (await client.get(path)).status_code == 200, path


async def test_one_tenant_cannot_list_read_search_or_delete_anothers_data(
    client: AsyncTestClient, keys: Keys
) -> None:
    a, b = bearer(keys.a), bearer(keys.b)
    session = (await client.post("/v1/sessions", json={"user_id": "alice"}, headers=a)).json()
    turn = await client.post(
        f"/v1/sessions/{session['id']}/messages",
        json={"content": "My name is Alice and I am allergic to peanuts"},
        headers=a,
    )
    assert turn.status_code == 200, turn.text
    fact = await client.post(
        "/v1/users/alice/facts", json={"text": "Alice is vegetarian"}, headers=a
    )
    assert fact.status_code == 201
    own_doc = await client.post(
        "/v1/knowledge",
        json={"title": "Alice's notes", "text": "Peanut allergy plan", "user_id": "alice"},
        headers=a,
    )
    shared_doc = await client.post(
        "/v1/knowledge", json={"title": "Acme handbook", "text": "Refunds in 30 days"}, headers=a
    )
    assert own_doc.status_code == shared_doc.status_code == 201

    missing_session = "00000000-0000-0000-0000-000000000000"
    for path in (f"/v1/sessions/{session['id']}", f"/v1/sessions/{missing_session}"):
        for method in ("GET", "DELETE"):
            response = await client.request(method, path, headers=b)
            refused(response, 404, f"session '{path.rsplit('/', 1)[1]}' not found")
    for suffix in ("messages", "summaries"):
        response = await client.get(f"/v1/sessions/{session['id']}/{suffix}", headers=b)
        refused(response, 404, f"session '{session['id']}' not found")
    posted = await client.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": "hi"}, headers=b
    )
    refused(posted, 404, f"session '{session['id']}' not found")
    imported = await client.post(
        f"/v1/sessions/{session['id']}/history",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers=b,
    )
    refused(imported, 404, f"session '{session['id']}' not found")

    listed = await client.get("/v1/sessions", params={"user_id": "alice"}, headers=b)
    assert listed.json() == {"sessions": []}
    searched = await client.post(
        "/v1/memory/search", json={"user_id": "alice", "query": "peanuts"}, headers=b
    )
    refused(searched, 404, "user 'alice' not found")
    facts = await client.get("/v1/users/alice/facts", headers=b)
    refused(facts, 404, "user 'alice' not found")
    fact_id = fact.json()["id"]
    for method in ("PATCH", "DELETE"):
        response = await client.request(
            method, f"/v1/facts/{fact_id}", json={"text": "changed"}, headers=b
        )
        refused(response, 404, f"fact {fact_id} not found")
    for document in (own_doc.json(), shared_doc.json()):
        for method in ("GET", "DELETE"):
            response = await client.request(method, f"/v1/knowledge/{document['id']}", headers=b)
            refused(response, 404, f"document '{document['id']}' not found")
    assert (await client.get("/v1/knowledge", headers=b)).json() == {"documents": []}

    # Tenant B's own "alice" is someone else: none of A's memories, facts or knowledge.
    theirs = (await client.post("/v1/sessions", json={"user_id": "alice"}, headers=b)).json()
    assert theirs["id"] != session["id"]
    found = await client.post(
        "/v1/memory/search",
        json={"user_id": "alice", "query": "peanuts", "kinds": ["turn", "fact", "knowledge"]},
        headers=b,
    )
    assert found.status_code == 200 and found.json() == {"results": []}
    b_turn = await client.post(
        f"/v1/sessions/{theirs['id']}/messages",
        json={"content": "What am I allergic to?"},
        headers=b,
    )
    context = b_turn.json()["context"]
    assert context["memories"] == [] and context["knowledge"] == []
    assert context["pinned_facts"] == [] and context["new_facts"] == []

    # Tenant A still sees all of its own.
    mine = await client.post(
        "/v1/memory/search",
        json={"user_id": "alice", "query": "peanuts", "kinds": ["turn", "knowledge"]},
        headers=a,
    )
    assert {r["kind"] for r in mine.json()["results"]} == {"turn", "knowledge"}
    assert (await client.get(f"/v1/sessions/{session['id']}", headers=a)).status_code == 200


async def test_a_non_admin_key_gets_403_on_every_admin_route(
    client: AsyncTestClient, keys: Keys
) -> None:
    routes = [
        (method, route.path)
        for route in client.app.routes
        if route.path.startswith("/admin") and route.path not in ("/admin/login", "/admin/logout")
        for method in sorted(route.methods - {"OPTIONS", "HEAD"})
    ]
    assert len(routes) >= 20
    for method, template in routes:
        path = (
            template.replace("{user_pk:int}", "1")
            .replace("{fact_id:int}", "1")
            .replace("{message_id:int}", "1")
            .replace("{session_id:str}", "s")
        )
        response = await client.request(method, path, headers=bearer(keys.a), json={})
        refused(response, 403, "this needs an admin API key")
    admin = await client.get("/admin/v1/tenants", headers=bearer(keys.admin))
    assert admin.status_code == 200
    names = [t["name"] for t in admin.json()["tenants"]]
    assert names == ["default", "acme", "globex", "ops"]


async def test_rate_limit_per_key_answers_429_with_retry_after(
    client: AsyncTestClient, keys: Keys
) -> None:
    limited = bearer(keys.limited)
    assert (await client.get("/v1/knowledge", headers=limited)).status_code == 200
    assert (await client.get("/v1/knowledge", headers=limited)).status_code == 200
    third = await client.get("/v1/knowledge", headers=limited)
    refused(third, 429, "rate limit of 2 requests per minute for this key reached")
    assert third.headers["retry-after"] == "30"
    # Other keys of the same tenant have their own budget.
    assert (await client.get("/v1/knowledge", headers=bearer(keys.a))).status_code == 200


async def test_token_bucket_refills_at_the_configured_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [await limiter.retry_after_s(1, 60) for _ in range(60)] == [0] * 60
    assert await limiter.retry_after_s(1, 60) == 1
    now[0] = 0.5
    assert await limiter.retry_after_s(1, 60) == 1
    now[0] = 1.0
    assert await limiter.retry_after_s(1, 60) == 0
    assert await limiter.retry_after_s(2, 60) == 0


async def test_local_mode_runs_in_the_default_tenant_and_refuses_open_addresses(
    settings: Settings,
) -> None:
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["ok"]))
    async with local_client(app) as client:
        created = await client.post("/v1/sessions", json={"user_id": "alice"})
        assert created.status_code == 201
        assert (await client.get("/admin/v1/tenants")).status_code == 200
        users = (await client.get("/admin/v1/users")).json()["users"]
        assert [(u["tenant"], u["user_id"]) for u in users] == [("default", "alice")]

    exposed = settings.model_copy(update={"host": "0.0.0.0"})
    app = create_app(exposed, embedder=HashEmbedder(), engine=ScriptedEngine(["ok"]))
    with pytest.raises(ExceptionGroup) as raised:  # the lifespan's task group wraps it
        async with local_client(app):
            pass
    (refusal,) = raised.value.exceptions
    assert isinstance(refusal, LocalModeRefusedError)
    assert str(refusal).startswith("refusing to serve on '0.0.0.0' without API keys")

    await make_keys(settings.resolved_database_url())
    app = create_app(exposed, embedder=HashEmbedder(), engine=ScriptedEngine(["ok"]))
    async with local_client(app) as client:
        assert (await client.post("/v1/sessions", json={"user_id": "x"})).status_code == 401


async def test_a_bootstrap_admin_key_lets_a_container_serve_on_its_address(
    settings: Settings,
) -> None:
    short = settings.model_copy(
        update={"host": "0.0.0.0", "access": AccessSettings(bootstrap_admin_key="short")}
    )
    app = create_app(short, embedder=HashEmbedder(), engine=ScriptedEngine(["ok"]))
    with pytest.raises(ExceptionGroup) as raised:
        async with local_client(app):
            pass
    assert "at least 32 characters" in str(raised.value.exceptions[0])

    secret = "b" * 40
    exposed = settings.model_copy(
        update={
            "host": "0.0.0.0",
            "access": AccessSettings(bootstrap_admin_key=secret),
        }
    )
    app = create_app(exposed, embedder=HashEmbedder(), engine=ScriptedEngine(["ok"]))
    async with local_client(app) as client:
        assert (await client.get("/admin/v1/tenants")).status_code == 401
        tenants = await client.get("/admin/v1/tenants", headers=bearer(secret))
        assert [t["name"] for t in tenants.json()["tenants"]] == ["default", "operators"]
    # Once keys exist, the variable adds nothing at the next start.
    app = create_app(exposed, embedder=HashEmbedder(), engine=ScriptedEngine(["ok"]))
    async with local_client(app) as client:
        keys = (await client.get("/admin/v1/tenants", headers=bearer(secret))).json()
        assert [t["num_active_keys"] for t in keys["tenants"]] == [0, 1]
