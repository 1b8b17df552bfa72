"""Who is asking: API keys, tenants, local mode, the admin guard and per-key rate limits.

Every request outside the public paths carries `Authorization: Bearer <key>`; the key names
a tenant, and everything the request reads or writes is that tenant's. A server started
on a store that never had a key is in local mode: it serves only on a loopback address
and every request runs in the default tenant, as an administrator (the operator is the
only client). Local mode is decided when the server starts and can only end while it
runs (at the first key created); a server started with keys never falls back to it,
whatever is revoked later, and nor does a restart once every key is revoked (unless the
operator allows it).

Unknown keys and failed admin sign-ins are counted per client address (behind trusted
proxies, the address they forward: `app.access.proxies`); past the limit the address
gets 429 for anything it sends with a key.

The admin page cannot send headers on navigation: signing in with an admin key opens a
session, and its random token (never the key) travels in the `memchat_admin_session`
cookie (HttpOnly, SameSite=Strict, path /admin), which only the page's routes accept;
`/admin/v1` takes Bearer keys only.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import structlog
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import (
    NotAuthorizedException,
    PermissionDeniedException,
    TooManyRequestsException,
)
from litestar.handlers.base import BaseRouteHandler
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from app.access.proxies import ProxyTrust
from app.access.rate_limits import RateLimiter, RateLimiterUnavailableError, RateLimits
from app.settings import Settings
from storage.access import AccessRepository, KeyOwner
from storage.models import DEFAULT_TENANT_ID

log = structlog.get_logger(__name__)

ADMIN_SESSION_COOKIE = "memchat_admin_session"
# Probes, metrics and the API description need no key.
PUBLIC_PATHS = ["^/healthz$", "^/readyz$", "^/metrics$", "^/schema", "^/swagger", "^/admin/login$"]


@dataclass(frozen=True, slots=True)
class Principal:
    """The identity of a request: its tenant, and the key that proved it (None: local mode)."""

    tenant_id: int
    tenant_name: str
    is_admin: bool
    key_id: int | None = None
    key_name: str = "local"
    key_prefix: str = ""

    @property
    def actor(self) -> str:
        """How the audit log names whoever made a change."""
        if self.key_id is None:
            return "local operator"
        return f"key {self.key_id} ({self.key_name}, {self.key_prefix}…)"


LOCAL_PRINCIPAL = Principal(DEFAULT_TENANT_ID, "default", is_admin=True)


def principal_of(owner: KeyOwner) -> Principal:
    return Principal(
        owner.tenant_id,
        owner.tenant_name,
        owner.is_admin,
        owner.key_id,
        owner.key_name,
        owner.key_prefix,
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LocalModeRefusedError(RuntimeError):
    """Serving on a non-loopback address with no API key would expose every memory."""


def bootstrap_key(settings: Settings) -> str | None:
    secret = settings.access.bootstrap_admin_key
    return secret.get_secret_value() if secret is not None else None


BOOTSTRAP_TENANT = "operators"
MIN_BOOTSTRAP_CHARS = 32


async def check_local_mode(
    access: AccessRepository,
    host: str,
    bootstrap_key: str | None = None,
    *,
    allow_after_keys: bool = False,
) -> bool:
    """True in local mode; refuses to serve beyond loopback without keys.

    Local mode starts only on a store that never had a key, unless `allow_after_keys`
    (MEMCHAT_ACCESS__ALLOW_LOCAL_MODE_AFTER_KEYS): a store whose keys were all revoked
    was meant to be closed, and opening it to whoever reaches the port on a restart
    would undo that. It serves instead with every request needing a key (none works
    until one is created, which works at once, without a restart).

    `bootstrap_key` (MEMCHAT_ACCESS__BOOTSTRAP_ADMIN_KEY) becomes an admin key of the tenant
    `operators` when no active key exists, so that a container can serve on its network
    address from its first start; a bootstrap key that was revoked is never made again.
    """
    if bootstrap_key and not await access.has_active_keys():
        await _create_bootstrap_key(access, bootstrap_key)
    if await access.has_active_keys():
        return False
    if await access.has_ever_had_keys() and not allow_after_keys:
        log.warning(
            "local_mode_not_started",
            detail="every API key of this store is revoked: serving with every request "
            "needing a key (create one with `memchat keys create --tenant NAME --admin`: it "
            "works at once); MEMCHAT_ACCESS__ALLOW_LOCAL_MODE_AFTER_KEYS=true starts it in "
            "local mode instead",
        )
        return False
    if not is_loopback(host):
        raise LocalModeRefusedError(
            f"refusing to serve on {host!r} without API keys: anyone who reaches it could read "
            "every memory. Create a key (`memchat keys create --tenant NAME`) or bind to "
            "127.0.0.1."
        )
    log.warning(
        "local_mode",
        detail="no API keys exist: serving on loopback only, every request in tenant "
        "'default' with admin rights; create one with `memchat keys create`",
    )
    return True


async def _create_bootstrap_key(access: AccessRepository, secret: str) -> None:
    if len(secret) < MIN_BOOTSTRAP_CHARS:
        raise LocalModeRefusedError(
            f"the bootstrap admin key must have at least {MIN_BOOTSTRAP_CHARS} characters "
            "(e.g. `openssl rand -hex 32`)"
        )
    if await access.is_known_secret(secret):
        log.warning(
            "bootstrap_admin_key_revoked",
            detail="MEMCHAT_ACCESS__BOOTSTRAP_ADMIN_KEY names a revoked key: it stays "
            "revoked; set a new secret to make a new bootstrap key",
        )
        return
    await access.create_key(BOOTSTRAP_TENANT, "bootstrap admin", is_admin=True, secret=secret)
    log.info("bootstrap_admin_key_created", tenant=BOOTSTRAP_TENANT)


def is_admin_page(path: str) -> bool:
    """The server-rendered admin page (cookie sessions), not the admin API."""
    return (path == "/admin" or path.startswith("/admin/")) and not path.startswith("/admin/v1")


def _bearer(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    header = connection.headers.get("authorization")
    if header is None:
        return None
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise NotAuthorizedException(
            "send the API key as `Authorization: Bearer <key>`",
            headers={"WWW-Authenticate": 'Bearer realm="memchat"'},
        )
    return secret.strip()


class AccessMiddleware(AbstractAuthenticationMiddleware):
    """Resolves the Principal of each request (`request.user`) and applies rate limits."""

    async def authenticate_request(
        self, connection: ASGIConnection[Any, Any, Any, Any]
    ) -> AuthenticationResult:
        gate: AccessGate = connection.app.state.access_gate
        secret = _bearer(connection)
        if secret is None and is_admin_page(connection.scope["path"]):
            principal = await gate.authenticate_session(
                connection.cookies.get(ADMIN_SESSION_COOKIE)
            )
        else:
            principal = await gate.authenticate(
                secret, gate.proxies.client_address(connection.scope)
            )
        return AuthenticationResult(user=principal, auth=principal.key_id)


_KEY_REQUIRED = "an API key is required: send `Authorization: Bearer <key>`"
_BEARER_REALM = {"WWW-Authenticate": 'Bearer realm="memchat"'}


class AccessGate:
    """Keys and admin sessions are looked up in SQL on every request, so a revoked key
    (and every session it opened) stops at once, in every process."""

    def __init__(
        self,
        default_requests_per_minute: int,
        rate_limits: RateLimits | None = None,
        *,
        failed_auth_per_minute: int = 0,
        proxies: ProxyTrust | None = None,
    ) -> None:
        """`rate_limits`: where requests are counted; None = this process (`RateLimiter`).
        `failed_auth_per_minute`: unknown keys and failed sign-ins a client address may
        send (0: no limit); `proxies`: whose forwarded headers name the client."""
        self._default_rpm = default_requests_per_minute
        self._limiter: RateLimits = RateLimiter() if rate_limits is None else rate_limits
        self._failed_per_minute = failed_auth_per_minute
        self._own_failures = RateLimiter()
        self.proxies = proxies if proxies is not None else ProxyTrust(())
        self._access: AccessRepository | None = None
        self._is_local = False

    def open(self, access: AccessRepository, *, local_mode: bool) -> None:
        """Start serving; `local_mode` is what the start found (see check_local_mode)."""
        self._access = access
        self._is_local = local_mode

    def close(self) -> None:
        self._access = None
        self._is_local = False

    @property
    def is_local_mode(self) -> bool:
        return self._is_local

    def _store(self) -> AccessRepository:
        if self._access is None:
            raise NotAuthorizedException("the service is starting")
        return self._access

    async def _still_local(self, access: AccessRepository) -> bool:
        """Local mode lasts until the first key exists; it never begins while serving."""
        if not self._is_local:
            return False
        if await access.has_active_keys():
            self._is_local = False
            log.warning("local_mode_ended", detail="an API key exists: every request needs one")
            return False
        return True

    async def authenticate(self, secret: str | None, client: str | None = None) -> Principal:
        """The principal of a Bearer key (or of local mode). `client`: the address whose
        unknown keys are counted (None: not counted)."""
        access = self._store()
        if await self._still_local(access):
            return LOCAL_PRINCIPAL
        if secret is None:
            raise NotAuthorizedException(_KEY_REQUIRED, headers=_BEARER_REALM)
        # Checked before the key: past its limit an address learns nothing of any key,
        # a right one included, until it may try again.
        await self._check_failures(client)
        owner = await access.get_key_owner_or_none(secret)
        if owner is None:
            await self._count_failure(client)
            raise NotAuthorizedException(
                "unknown or revoked API key",
                headers={"WWW-Authenticate": 'Bearer realm="memchat", error="invalid_token"'},
            )
        await self._check_rate(owner)
        return principal_of(owner)

    async def authenticate_session(self, token: str | None) -> Principal:
        """The principal of an admin page session cookie (or of local mode)."""
        access = self._store()
        if await self._still_local(access):
            return LOCAL_PRINCIPAL
        owner = await access.get_session_owner_or_none(token) if token else None
        if owner is None:
            raise NotAuthorizedException("sign in with an admin key", headers=_BEARER_REALM)
        await self._check_rate(owner)
        return principal_of(owner)

    async def sign_in(
        self, secret: str, ttl_s: float, client: str | None = None
    ) -> tuple[Principal, str | None]:
        """An admin key's principal and a new session token (None in local mode, which
        needs no session); refuses keys that are unknown, revoked or not admin, and
        counts each refusal against `client`."""
        principal = await self.authenticate(secret, client)
        if not principal.is_admin:
            await self._count_failure(client)
            raise PermissionDeniedException("this needs an admin API key")
        if principal.key_id is None:
            return principal, None
        return principal, await self._store().create_admin_session(principal.key_id, ttl_s)

    async def sign_out(self, token: str) -> None:
        await self._store().delete_admin_session(token)

    def _failures_bucket(self, client: str | None) -> str | None:
        if client is None or self._failed_per_minute <= 0:
            return None
        return f"auth-failures:{client}"

    async def _failures_wait_s(self, bucket: str, *, take: bool) -> int:
        """Failures are counted where requests are (Redis when shared); while Redis is down
        each process counts its own rather than refusing every request with a key."""
        try:
            return await self._limiter.retry_after_s(bucket, self._failed_per_minute, take=take)
        except RateLimiterUnavailableError:
            return await self._own_failures.retry_after_s(
                bucket, self._failed_per_minute, take=take
            )

    async def _check_failures(self, client: str | None) -> None:
        """429 while the address has used up its failed attempts (nothing is counted)."""
        bucket = self._failures_bucket(client)
        if bucket is None:
            return
        wait_s = await self._failures_wait_s(bucket, take=False)
        if wait_s:
            raise TooManyRequestsException(
                f"too many unknown API keys or failed sign-ins from this address "
                f"({self._failed_per_minute} a minute); retry in {wait_s} s",
                headers={"Retry-After": str(wait_s)},
            )

    async def _count_failure(self, client: str | None) -> None:
        bucket = self._failures_bucket(client)
        if bucket is not None:
            await self._failures_wait_s(bucket, take=True)

    async def _check_rate(self, owner: KeyOwner) -> None:
        """429 past the key's limit; `RateLimiterUnavailableError` when the shared limiter
        cannot count (the request is refused, not let through unlimited)."""
        per_minute = owner.requests_per_minute
        if per_minute is None:
            per_minute = self._default_rpm
        if per_minute <= 0:
            return
        wait_s = await self._limiter.retry_after_s(owner.key_id, per_minute)
        if wait_s:
            raise TooManyRequestsException(
                f"rate limit of {per_minute} requests per minute for this key reached; "
                f"retry in {wait_s} s",
                headers={"Retry-After": str(wait_s)},
            )


def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard of every /admin route."""
    principal = connection.user
    if not isinstance(principal, Principal) or not principal.is_admin:
        raise PermissionDeniedException("this needs an admin API key")


def provide_principal(request: Request[Any, Any, Any]) -> Principal:
    return request.user
