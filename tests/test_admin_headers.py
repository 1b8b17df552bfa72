"""What the admin page and the admin API tell the browser: no framing, sniffing, caching
or referring, a Content-Security-Policy that runs only the page's own nonce'd style and
script, and a Secure cookie when the browser's connection was TLS, to a trusted proxy
in front of the service included."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from app.factory import create_app
from app.settings import Settings
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server
from tests.test_cross_site import FORM, new_key

BROWSER_HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
POLICY = re.compile(
    r"^default-src 'none'; style-src 'nonce-(?P<nonce>[\w-]{22})'; "
    r"script-src 'nonce-(?P=nonce)'; img-src 'self'; form-action 'self'; base-uri 'none'; "
    r"frame-ancestors 'none'$"
)


@pytest.fixture
def settings(tmp_path: Path, sqlite_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=sqlite_url)


def make_app(settings: Settings):
    return create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 5))


def nonce_of(response: httpx.Response) -> str:
    """The answer's policy nonce, after checking every header the browser is sent."""
    for name, value in BROWSER_HEADERS.items():
        assert response.headers.get_list(name) == [value], (name, response.url)
    [policy] = response.headers.get_list("content-security-policy")
    match = POLICY.match(policy)
    assert match, policy
    return match.group("nonce")


def assert_page_runs_under_its_policy(response: httpx.Response) -> None:
    """Its only style and script carry the answer's nonce; no inline handler or style
    attribute (which no nonce allows) is left."""
    assert response.status_code == 200, response.text
    nonce = nonce_of(response)
    assert re.findall(r"<(style|script)\b([^>]*)>", response.text) == [
        ("style", f' nonce="{nonce}"'),
        ("script", f' nonce="{nonce}"'),
    ]
    assert not re.search(r"\s(on\w+|style)\s*=", response.text), response.url


async def test_every_admin_answer_tells_the_browser_how_to_treat_it(settings: Settings) -> None:
    async with local_client(make_app(settings)) as client:
        await client.post("/v1/sessions", json={"user_id": "alice"})
        await client.post("/v1/users/alice/facts", json={"text": "Likes tea"})
        user = (await client.get("/admin/v1/users")).json()["users"][0]
        session_id = (await client.get("/v1/sessions?user_id=alice")).json()["sessions"][0]["id"]
        nonces = set()
        for path in (
            "/admin",
            f"/admin/users/{user['id']}",
            f"/admin/users/{user['id']}/sessions/{session_id}",
            "/admin/audit",
            "/admin/login",
        ):
            page = await client.get(path, follow_redirects=False)
            if path != "/admin/login":
                assert_page_runs_under_its_policy(page)
            nonces.add(nonce_of(page))
        assert len(nonces) == 5  # one per answer
        # The admin API, its errors and the guard's refusals too.
        for response in (
            await client.get("/admin/v1/tenants"),
            await client.get("/admin/v1/users/999"),
            await client.post(
                "/admin/logout", data={}, headers={**FORM, "Sec-Fetch-Site": "cross-site"}
            ),
        ):
            nonce_of(response)
        assert (await client.get("/admin/v1/users/999")).status_code == 404
        # The rest of the API is not a page: left as it was.
        api = await client.get("/v1/sessions?user_id=alice")
        assert "content-security-policy" not in api.headers


async def test_signed_out_answers_carry_them_too(settings: Settings) -> None:
    await new_key(settings.resolved_database_url(), "ops", is_admin=True)
    async with local_client(make_app(settings)) as client:
        login = await client.get("/admin/login")
        assert_page_runs_under_its_policy(login)
        for response in (
            await client.get("/admin", follow_redirects=False),
            await client.get("/admin/v1/tenants"),
            await client.post("/admin/login", data={"key": "mck_wrong"}, headers=FORM),
        ):
            assert response.status_code in (303, 401), response.text
            nonce_of(response)


def client_from(base: str, address: str) -> httpx.Client:
    """A client whose connections come from `address` (any of 127.0.0.0/8 on Linux)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=base, transport=transport, timeout=30)


def session_cookie(response: httpx.Response) -> str:
    [cookie] = [
        c for c in response.headers.get_list("set-cookie") if c.startswith("memchat_admin_session=")
    ]
    return cookie


async def test_the_session_cookie_is_secure_behind_a_trusted_tls_proxy(settings: Settings) -> None:
    _, admin = await new_key(settings.resolved_database_url(), "ops", is_admin=True)
    proxied = settings.model_copy(
        update={"access": settings.access.model_copy(update={"trusted_proxies": ["127.0.0.2/32"]})}
    )
    tls = {"X-Forwarded-Proto": "https", **FORM}
    with live_server(make_app(proxied)) as base:
        with client_from(base, "127.0.0.2") as proxy:
            signed_in = proxy.post("/admin/login", data={"key": admin}, headers=tls)
            assert signed_in.status_code == 303, signed_in.text
            assert "; secure" in session_cookie(signed_in).lower()
            plain = proxy.post("/admin/login", data={"key": admin}, headers=FORM)
            assert "secure" not in session_cookie(plain).lower()
        # Anybody else saying so is not believed.
        with client_from(base, "127.0.0.3") as other:
            claimed = other.post("/admin/login", data={"key": admin}, headers=tls)
            assert claimed.status_code == 303, claimed.text
            assert "secure" not in session_cookie(claimed).lower()
