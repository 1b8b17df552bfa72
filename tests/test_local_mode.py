"""Local mode (no key needed) across restarts, and behind proxies, on SQLite and PostgreSQL.

A store that once had a key never starts in local mode again unless the operator says
so: revoking every key closes it, whatever restarts follow. A revoked bootstrap key is
not made again. In local mode a request that came through a reverse proxy is refused.
"""

from __future__ import annotations

import pytest

from app.factory import create_app
from app.settings import AccessSettings, Settings
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_access import bearer, refused
from tests.test_cross_site import new_key, revoke

PROXY_REFUSAL = "a request through a proxy is refused: in local mode (no API keys)"


def make_app(settings: Settings):
    return create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 5))


def with_access(settings: Settings, **changes: object) -> Settings:
    return settings.model_copy(update={"access": settings.access.model_copy(update=changes)})


async def test_a_store_whose_keys_are_all_revoked_restarts_asking_for_a_key(
    settings: Settings,
) -> None:
    url = settings.resolved_database_url()
    key_id, secret = await new_key(url, "ops", is_admin=True)
    await revoke(url, key_id)
    async with local_client(make_app(settings)) as client:
        refused(await client.get("/admin/v1/tenants"), 401, "an API key is required")
        refused(await client.get("/v1/sessions?user_id=alice"), 401, "an API key is required")
        refused(
            await client.get("/admin/v1/tenants", headers=bearer(secret)),
            401,
            "unknown or revoked API key",
        )
        page = await client.get("/admin", follow_redirects=False)
        assert (page.status_code, page.headers["location"]) == (303, "/admin/login")
        # A key created while it serves works at once.
        fresh_id, fresh = await new_key(url, "ops", is_admin=True)
        tenants = await client.get("/admin/v1/tenants", headers=bearer(fresh))
        assert tenants.status_code == 200, tenants.text
    # Bound to every address, it serves too: nothing is open without a key.
    exposed = settings.model_copy(update={"host": "0.0.0.0"})
    await revoke(url, fresh_id)
    async with local_client(make_app(exposed)) as client:
        refused(await client.get("/admin/v1/tenants"), 401, "an API key is required")


async def test_the_operators_flag_brings_local_mode_back(settings: Settings) -> None:
    url = settings.resolved_database_url()
    key_id, _ = await new_key(url)
    await revoke(url, key_id)
    allowed = with_access(settings, allow_local_mode_after_keys=True)
    async with local_client(make_app(allowed)) as client:
        tenants = await client.get("/admin/v1/tenants")
        assert tenants.status_code == 200, tenants.text
        assert [t["name"] for t in tenants.json()["tenants"]] == ["default", "acme"]
    # Still on loopback only.
    exposed = allowed.model_copy(update={"host": "0.0.0.0"})
    with pytest.raises(ExceptionGroup) as raised:
        async with local_client(make_app(exposed)):
            pass
    assert "refusing to serve on '0.0.0.0' without API keys" in str(raised.value.exceptions[0])


async def test_a_revoked_bootstrap_key_is_not_made_again(settings: Settings) -> None:
    secret = "b" * 40
    bootstrapped = settings.model_copy(
        update={"host": "0.0.0.0", "access": AccessSettings(bootstrap_admin_key=secret)}
    )
    async with local_client(make_app(bootstrapped)) as client:
        assert (await client.get("/admin/v1/tenants", headers=bearer(secret))).status_code == 200
    engine = create_engine(settings.resolved_database_url())
    try:
        access = AccessRepository(Database(engine))
        [(key, _tenant)] = await access.list_keys()
        await access.revoke_key(key.id)
    finally:
        await engine.dispose()
    async with local_client(make_app(bootstrapped)) as client:
        refused(
            await client.get("/admin/v1/tenants", headers=bearer(secret)),
            401,
            "unknown or revoked API key",
        )
        refused(await client.get("/admin/v1/tenants"), 401, "an API key is required")


@pytest.mark.parametrize(
    "header",
    [
        {"X-Forwarded-For": "1.2.3.4"},
        {"Forwarded": "for=1.2.3.4"},
        {"X-Forwarded-Host": "memchat.example.com"},
        {"X-Real-IP": "1.2.3.4"},
        {"Via": "1.1 proxy"},
    ],
)
async def test_local_mode_refuses_requests_that_came_through_a_proxy(
    settings: Settings, header: dict[str, str]
) -> None:
    async with local_client(make_app(settings)) as client:
        for method, path in (
            ("GET", "/admin/v1/tenants"),
            ("GET", "/v1/sessions?user_id=alice"),
            ("POST", "/v1/sessions"),
            ("GET", "/admin"),
            ("GET", "/healthz"),
        ):
            response = await client.request(method, path, json={"user_id": "a"}, headers=header)
            refused(response, 403, PROXY_REFUSAL)
        assert (await client.get("/admin/v1/tenants")).status_code == 200


async def test_with_keys_requests_through_a_proxy_are_served(settings: Settings) -> None:
    _, secret = await new_key(settings.resolved_database_url(), "ops", is_admin=True)
    async with local_client(make_app(settings)) as client:
        forwarded = {"X-Forwarded-For": "1.2.3.4", "Forwarded": "for=1.2.3.4", **bearer(secret)}
        response = await client.get("/admin/v1/tenants", headers=forwarded)
        assert response.status_code == 200, response.text
