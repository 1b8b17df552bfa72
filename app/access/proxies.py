"""Who sent a request, and over what, when a reverse proxy may stand in between.

A TLS-terminating proxy talks plain HTTP to the service and says what it saw in
`X-Forwarded-Proto` and `X-Forwarded-For`. Anybody can send those headers, so they are
believed only from the addresses in `MEMCHAT_ACCESS__TRUSTED_PROXIES`; from any other
peer the connection itself is the truth. (`memchat serve` runs uvicorn, which already
applies them for loopback peers: `FORWARDED_ALLOW_IPS`, 127.0.0.1 unless set.)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    """The last value of a header (a proxy appends; the last one is the nearest's)."""
    found = None
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            found = value.decode("latin-1")
    return found


class ProxyTrust:
    """The client address and scheme of a request, believing forwarded headers only from
    trusted proxies."""

    def __init__(self, networks: Iterable[Network | str]) -> None:
        self._networks = tuple(ipaddress.ip_network(n, strict=False) for n in networks)

    def is_trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        return any(ip in network for network in self._networks)

    def _peer(self, scope: Mapping[str, Any]) -> str:
        client = scope.get("client")
        return str(client[0]) if client else ""

    def _is_from_proxy(self, scope: Mapping[str, Any]) -> bool:
        return bool(self._networks) and self.is_trusted(self._peer(scope))

    def client_address(self, scope: Mapping[str, Any]) -> str:
        """The peer's address; from a trusted proxy, the nearest address in its
        `X-Forwarded-For` that is not itself a trusted proxy."""
        peer = self._peer(scope)
        forwarded = _header(scope, b"x-forwarded-for") if self._is_from_proxy(scope) else None
        if not forwarded:
            return peer
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self.is_trusted(hop):
                return hop
        return hops[0] if hops else peer

    def is_https(self, scope: Mapping[str, Any]) -> bool:
        """Whether the client's connection was TLS: to this server, or to a trusted proxy
        that says so in `X-Forwarded-Proto`."""
        if scope.get("scheme") == "https":
            return True
        if not self._is_from_proxy(scope):
            return False
        proto = _header(scope, b"x-forwarded-proto") or ""
        return proto.rsplit(",", 1)[-1].strip().lower() == "https"
