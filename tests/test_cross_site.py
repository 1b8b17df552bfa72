"""Authentication that cannot switch off, and requests a browser was made to send.

A server started with keys never serves anybody as the local operator, whatever is
revoked; local mode (started without keys) answers only this machine's Host, refuses
cross-site and cross-origin writes, JSON sent as anything but JSON, admin forms without
the browser's token, and redirects to anywhere but its own admin pages. The admin
page's cookie holds a session token, never the key, and opens only the page's routes.
On SQLite and PostgreSQL.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import Settings
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_access import bearer, refused

FORM = {"content-type": "application/x-www-form-urlencoded"}


async def new_key(url: str, tenant: str = "acme", *, is_admin: bool = False) -> tuple[int, str]:
    engine = create_engine(url)
    try:
        key, secret = await AccessRepository(Database(engine)).create_key(
            tenant, tenant, is_admin=is_admin
        )
        return key.id, secret
    finally:
        await engine.dispose()


async def revoke(url: str, key_id: int) -> None:
    engine = create_engine(url)
    try:
        await AccessRepository(Database(engine)).revoke_key(key_id)
    finally:
        await engine.dispose()


def make_app(settings: Settings):
    return create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 20))


@pytest.fixture
async def local(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    async with local_client(make_app(settings)) as client:
        yield client


async def test_revoking_the_last_key_never_opens_a_running_server(settings: Settings) -> None:
    url = settings.resolved_database_url()
    key_id, secret = await new_key(url, is_admin=True)
    async with local_client(make_app(settings)) as client:
        assert (await client.get("/admin/v1/tenants", headers=bearer(secret))).status_code == 200
        await revoke(url, key_id)
        # No active key is left: the server still asks for one, and the revoked key is dead.
        refused(await client.get("/admin/v1/users"), 401, "an API key is required")
        refused(
            await client.get("/admin/v1/users", headers=bearer(secret)),
            401,
            "unknown or revoked API key",
        )
        refused(await client.get("/v1/sessions?user_id=alice"), 401, "an API key is required")


async def test_local_mode_ends_at_the_first_key_and_never_comes_back(settings: Settings) -> None:
    url = settings.resolved_database_url()
    async with local_client(make_app(settings)) as client:
        assert (await client.get("/admin/v1/users")).status_code == 200
        key_id, secret = await new_key(url)
        refused(await client.get("/admin/v1/users"), 401, "an API key is required")
        assert (await client.get("/v1/sessions?user_id=a", headers=bearer(secret))).status_code == (
            200
        )
        await revoke(url, key_id)
        refused(await client.get("/admin/v1/users"), 401, "an API key is required")


async def test_local_mode_answers_only_this_machines_host(local: AsyncTestClient) -> None:
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "127.0.0.2"):
        response = await local.get("/v1/sessions?user_id=alice", headers={"Host": host})
        assert response.status_code == 200, host
    for host in ("attacker.example:8000", "attacker.example", "192.168.1.5:8000", ""):
        response = await local.get("/v1/sessions?user_id=alice", headers={"Host": host})
        refused(response, 403, "the Host")


async def test_local_hosts_setting_adds_names(settings: Settings) -> None:
    named = settings.model_copy(
        update={"access": settings.access.model_copy(update={"local_hosts": ["memchat.lan"]})}
    )
    async with local_client(make_app(named)) as client:
        response = await client.get("/healthz", headers={"Host": "memchat.lan:8000"})
        assert response.status_code == 200
        refused(await client.get("/healthz", headers={"Host": "other.lan"}), 403, "the Host")


async def test_local_mode_refuses_cross_site_and_cross_origin_writes(
    local: AsyncTestClient,
) -> None:
    created = await local.post("/v1/sessions", json={"user_id": "alice"})
    assert created.status_code == 201
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "http://127.0.0.1:3000"},  # another port: same site, other origin
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        response = await local.post("/v1/sessions", json={"user_id": "mallory"}, headers=headers)
        refused(response, 403, "a request from")
    # The service's own pages (same origin) and clients that are not browsers pass.
    same = {"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}
    assert (
        await local.post("/v1/sessions", json={"user_id": "bob"}, headers=same)
    ).status_code == (201)
    users = (await local.get("/admin/v1/users")).json()["users"]
    assert sorted(u["user_id"] for u in users) == ["alice", "bob"]


async def test_json_operations_take_json_only(local: AsyncTestClient) -> None:
    body = '{"text": "planted fact", "subject": "="}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        response = await local.post(
            "/v1/users/alice/facts", content=body, headers={"content-type": content_type}
        )
        refused(response, 415, "send the body as JSON")
    response = await local.post("/v1/users/alice/facts", content=body)  # no content type
    refused(response, 415, "send the body as JSON")
    assert (await local.get("/v1/users/alice/facts")).status_code == 404  # nothing stored
    response = await local.post(
        "/v1/users/alice/facts",
        content=body,
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 201, response.text


def form_token(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert match, "the page's forms carry no token"
    return match.group(1)


async def a_user_with_a_fact(client: AsyncTestClient) -> tuple[int, int]:
    await client.post("/v1/sessions", json={"user_id": "alice"})
    fact = await client.post("/v1/users/alice/facts", json={"text": "Likes tea", "pinned": True})
    user = (await client.get("/admin/v1/users")).json()["users"][0]
    return user["id"], fact.json()["id"]


async def test_admin_forms_need_this_browsers_token_and_redirect_home_only(
    local: AsyncTestClient,
) -> None:
    user_pk, fact_id = await a_user_with_a_fact(local)
    # A form posted by another page (no token, or a made-up one): refused, nothing done.
    for data in ({"x": "1"}, {"csrf": "0" * 64}):
        response = await local.post(f"/admin/users/{user_pk}/erase", data=data, headers=FORM)
        refused(response, 403, "the form's token is missing")
    assert [u["id"] for u in (await local.get("/admin/v1/users")).json()["users"]] == [user_pk]
    # The page hands this browser its token (and the cookie it is tied to).
    page = await local.get(f"/admin/users/{user_pk}")
    assert page.status_code == 200
    assert "memchat_csrf" in page.cookies
    token = form_token(page.text)
    # A redirect target outside the admin page is replaced by the page's own.
    for back in ("https://evil.example/phish", "//evil.example", "/\\evil.example", "/v1/x"):
        response = await local.post(
            f"/admin/facts/{fact_id}/edit",
            data={"csrf": token, "back": back, "action": "unpin"},
            headers=FORM,
            follow_redirects=False,
        )
        assert response.status_code == 303, response.text
        assert response.headers["location"] == f"/admin/users/{user_pk}"
    response = await local.post(
        f"/admin/facts/{fact_id}/delete",
        data={"csrf": token, "back": f"/admin/users/{user_pk}#facts"},
        headers=FORM,
        follow_redirects=False,
    )
    assert response.headers["location"] == f"/admin/users/{user_pk}#facts"
    # Even with the token, a post from another origin is refused before it is read.
    response = await local.post(
        f"/admin/users/{user_pk}/erase",
        data={"csrf": token},
        headers={**FORM, "Origin": "https://evil.example"},
    )
    refused(response, 403, "a request from the origin")
    response = await local.post(f"/admin/users/{user_pk}/erase", data={"csrf": token}, headers=FORM)
    assert response.status_code in (200, 303)
    assert (await local.get("/admin/v1/users")).json()["users"] == []


async def test_the_admin_cookie_is_a_session_not_the_key(settings: Settings) -> None:
    url = settings.resolved_database_url()
    key_id, admin = await new_key(url, "ops", is_admin=True)
    _, app_key = await new_key(url)
    async with local_client(make_app(settings)) as client:
        signed_in = await client.post(
            "/admin/login", data={"key": admin}, headers=FORM, follow_redirects=False
        )
        assert signed_in.status_code == 303
        token = client.cookies["memchat_admin_session"]
        assert admin not in token and len(token) >= 40
        assert "HttpOnly" in signed_in.headers["set-cookie"]
        assert "samesite=strict" in signed_in.headers["set-cookie"].lower()
        # The cookie opens the page, not the admin API.
        assert (await client.get("/admin")).status_code == 200
        refused(await client.get("/admin/v1/users"), 401, "an API key is required")
        # Another page of the same site (another port) cannot post with it.
        page = await client.get("/admin")
        response = await client.post(
            "/admin/logout",
            data={"csrf": form_token(page.text)},
            headers={**FORM, "Sec-Fetch-Site": "same-site"},
        )
        refused(response, 403, "a request from another site")
        # A non-admin key opens no session.
        client.cookies.clear()
        refused_login = await client.post("/admin/login", data={"key": app_key}, headers=FORM)
        assert refused_login.status_code == 401
        assert "memchat_admin_session" not in refused_login.cookies
        # Revoking the key ends its sessions at once.
        await client.post("/admin/login", data={"key": admin}, headers=FORM)
        assert (await client.get("/admin", follow_redirects=False)).status_code == 200
        await revoke(url, key_id)
        gone = await client.get("/admin", follow_redirects=False)
        assert (gone.status_code, gone.headers["location"]) == (303, "/admin/login")
