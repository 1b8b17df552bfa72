"""Guessing keys is throttled per client address, on SQLite and PostgreSQL: past a few
unknown keys or failed admin sign-ins a minute, an address gets 429 for anything it
sends with a key (a right one included, so that it learns nothing), while every other
address is served. Behind a trusted proxy the address is the one the proxy forwards.

The server is a real uvicorn; clients connect from addresses of their own (127.0.0.x).
"""

from __future__ import annotations

import httpx

from app.factory import create_app
from app.settings import Settings
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server
from tests.test_admin_headers import client_from
from tests.test_cross_site import FORM, new_key

LIMIT = 3
# A token comes back every 20 s (3 a minute); the server's clock runs while the test does.
THROTTLED = "too many unknown API keys or failed sign-ins from this address (3 a minute)"


def throttled_app(settings: Settings, **access: object):
    changes = {"failed_auth_per_minute": LIMIT, **access}
    limited = settings.model_copy(update={"access": settings.access.model_copy(update=changes)})
    return create_app(limited, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 5))


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def assert_throttled(response: httpx.Response, instance: str) -> None:
    assert response.status_code == 429, response.text
    wait_s = int(response.headers["retry-after"])
    assert 10 <= wait_s <= 20
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json() == {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": f"{THROTTLED}; retry in {wait_s} s",
        "instance": instance,
    }


async def test_unknown_keys_are_throttled_per_address(settings: Settings) -> None:
    _, good = await new_key(settings.resolved_database_url())
    with (
        live_server(throttled_app(settings)) as base,
        client_from(base, "127.0.0.2") as guesser,
        client_from(base, "127.0.0.3") as other,
    ):
        for n in range(LIMIT):
            wrong = guesser.get("/v1/knowledge", headers=bearer(f"mck_guess{n}"))
            assert wrong.status_code == 401, wrong.text
        assert_throttled(guesser.get("/v1/knowledge", headers=bearer("mck_x")), "/v1/knowledge")
        # A right key from the same address learns nothing either.
        assert_throttled(guesser.get("/v1/knowledge", headers=bearer(good)), "/v1/knowledge")
        # Another address is served, and has its own budget of mistakes.
        assert other.get("/v1/knowledge", headers=bearer(good)).status_code == 200
        assert other.get("/v1/knowledge", headers=bearer("mck_typo")).status_code == 401
        assert other.get("/v1/knowledge", headers=bearer(good)).status_code == 200
        # A request without a key guesses nothing and is not counted.
        for _ in range(LIMIT + 1):
            assert other.get("/v1/knowledge").status_code == 401


async def test_failed_admin_sign_ins_are_throttled_per_address(settings: Settings) -> None:
    url = settings.resolved_database_url()
    _, admin = await new_key(url, "ops", is_admin=True)
    _, not_admin = await new_key(url)
    with (
        live_server(throttled_app(settings)) as base,
        client_from(base, "127.0.0.2") as guesser,
        client_from(base, "127.0.0.3") as other,
    ):
        for secret in ("mck_wrong", not_admin, "mck_wrong2"):
            failed = guesser.post("/admin/login", data={"key": secret}, headers=FORM)
            assert failed.status_code == 401, failed.text
            assert "not an active admin key" in failed.text
        for secret in ("mck_wrong3", admin):
            response = guesser.post("/admin/login", data={"key": secret}, headers=FORM)
            assert_throttled(response, "/admin/login")
        # Unknown keys on the API and sign-ins share the address's budget.
        assert_throttled(
            guesser.get("/admin/v1/tenants", headers=bearer(admin)), "/admin/v1/tenants"
        )
        signed_in = other.post("/admin/login", data={"key": admin}, headers=FORM)
        assert signed_in.status_code == 303, signed_in.text
        assert other.get("/admin/v1/tenants", headers=bearer(admin)).status_code == 200


async def test_behind_a_trusted_proxy_the_forwarded_address_is_throttled(
    settings: Settings,
) -> None:
    _, good = await new_key(settings.resolved_database_url())
    app = throttled_app(settings, trusted_proxies=["127.0.0.2"])
    with (
        live_server(app) as base,
        client_from(base, "127.0.0.2") as proxy,
        client_from(base, "127.0.0.4") as direct,
    ):
        guesser = {"X-Forwarded-For": "198.51.100.7, 127.0.0.2"}
        for n in range(LIMIT):
            headers = guesser | bearer(f"mck_guess{n}")
            assert proxy.get("/v1/knowledge", headers=headers).status_code == 401
        response = proxy.get("/v1/knowledge", headers=guesser | bearer(good))
        assert_throttled(response, "/v1/knowledge")
        # Another client through the same proxy is served.
        someone = {"X-Forwarded-For": "198.51.100.8"} | bearer(good)
        assert proxy.get("/v1/knowledge", headers=someone).status_code == 200
        # A client that is not a trusted proxy cannot pick its address.
        for n in range(LIMIT):
            headers = {"X-Forwarded-For": f"203.0.113.{n}"} | bearer("mck_guess")
            assert direct.get("/v1/knowledge", headers=headers).status_code == 401
        headers = {"X-Forwarded-For": "203.0.113.99"} | bearer(good)
        assert_throttled(direct.get("/v1/knowledge", headers=headers), "/v1/knowledge")
