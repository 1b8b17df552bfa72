"""Test clients addressed as a local operator's browser or script would address the
service: at a loopback address (local mode refuses any other Host)."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient

LOCAL_URL = "http://127.0.0.1:8000"


def local_client(app: Litestar, **kwargs: Any) -> AsyncTestClient[Litestar]:
    return AsyncTestClient(app=app, base_url=LOCAL_URL, **kwargs)
