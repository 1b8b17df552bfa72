"""Every Python example of the client's documentation runs: the README's "From Python"
section and each Python block of docs/clients.md, as a script of its own against a real
memchat server (tests/client_server.py), its address in `MEMCHAT_URL` and its key in
`MEMCHAT_API_KEY`, as the examples read them. What each prints is checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.client_server import REPLY, Server, memchat_server

ROOT = Path(__file__).resolve().parents[1]
CLIENT_ROOT = ROOT / "app" / "client"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    return _BLOCK.findall(text)


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


# What each example prints, in the order the examples come.
EXPECTED: dict[str, list[list[str]]] = {
    "README.md#from-python": [[REPLY, "turn "]],
    "docs/clients.md": [
        [REPLY, "turn ", "I am allergic to peanuts"],
        ["我姐姐住在成都。"],
        [
            "user 我下周去杭州出差。",
            f"assistant {REPLY}",
            " records in lin.jsonl",
        ],
        ["404 session 'no-such-session' not found", "[('temperature', 'Expected `float` <= 2.0')]"],
        [
            "Try apple slices.\nSorbet.\n",
            "[('user', 'I am allergic to peanuts. A snack?'), ('assistant', 'Try apple slices.'), "
            "('user', 'And a dessert?'), ('assistant', 'Sorbet.')]",
        ],
        ["My sister lives in Chengdu.", "user Where does my sister live?"],
    ],
}


def examples() -> list[tuple[str, int, str]]:
    found = {
        "README.md#from-python": python_blocks(readme_section("From Python")),
        "docs/clients.md": python_blocks((ROOT / "docs" / "clients.md").read_text()),
    }
    assert {name: len(blocks) for name, blocks in found.items()} == {
        name: len(expected) for name, expected in EXPECTED.items()
    }
    return [(name, i, block) for name, blocks in found.items() for i, block in enumerate(blocks)]


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    async with memchat_server(tmp_path_factory.mktemp("docs")) as running:
        yield running


@pytest.mark.parametrize(("source", "index", "code"), examples())
def test_the_example_runs(
    server: Server, tmp_path: Path, source: str, index: int, code: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
    env |= {
        "MEMCHAT_URL": server.url,
        "MEMCHAT_API_KEY": server.api_key,
        "PYTHONPATH": os.pathsep.join([str(CLIENT_ROOT), env.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for expected in EXPECTED[source][index]:
        assert expected in done.stdout, done.stdout
