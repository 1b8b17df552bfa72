"""`make stack-local` as a test: tools/stack_local.py starts the compose topology without
Docker (PostgreSQL, a Chroma server, two vLLM replicas on the CPU, two app processes
behind haproxy), smoke-tests it through the balancer and stops it. The smoke test's own
assertions live in the script; here it must exit 0 having said so.

With MEMCHAT_TEST_VLLM=skip it is skipped, like the other real-vLLM tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_ADMIN_URL
from tests.live import MODELS_DIR
from tests.vllm_servers import prepare

pytestmark = [pytest.mark.vllm, pytest.mark.postgres, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[1]


def test_stack_local_smoke_test_passes() -> None:
    prepare()  # fails, or skips with MEMCHAT_TEST_VLLM=skip, when vLLM is unavailable
    if shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists():
        message = "haproxy is not installed (`make haproxy`)"
        if os.environ.get("MEMCHAT_TEST_VLLM") == "skip":
            pytest.skip(message)
        pytest.fail(message)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
    env["MEMCHAT_STACK_POSTGRES_URL"] = POSTGRES_ADMIN_URL
    env["MEMCHAT_MODELS_DIR"] = str(MODELS_DIR)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "stack_local.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "[stack-local] smoke test passed" in done.stdout, output[-6000:]
    assert "[stack-local] stopped every service" in done.stdout
