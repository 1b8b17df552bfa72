"""Start `memchat serve` on a fresh data dir for a benchmark (shared by the bench scripts)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def start_server(
    data_dir: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
    env |= {
        "MEMCHAT_DATA_DIR": str(data_dir),
        "MEMCHAT_PORT": str(port),
        "MEMCHAT_LOG_LEVEL": "warning",
        **(extra_env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("memchat serve did not become ready")
