"""A real Chroma server (`chroma run` from the chromadb package) on a loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.live import free_port


@contextmanager
def chroma_server(path: Path) -> Iterator[str]:
    port = free_port()
    log = (path.parent / f"{path.name}.log").open("wb")
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    command = [str(Path(sys.executable).parent / "chroma"), "run", "--path", str(path)]
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(process, url)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
        log.close()


def _wait_until_up(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"`chroma run` exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/api/v2/heartbeat", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the Chroma server did not start within 60 s")
