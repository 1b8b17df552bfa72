"""A database file that is not a database, or a damaged one, stops `memchat migrate` and
`memchat serve` with one line naming the file, what is wrong and what to do: no
traceback, exit status 2, the file left as it was."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.live import MEMCHAT, cli_env

ADVICE = (
    "If it is damaged, restore it from a backup, or move it away to start with an empty database"
)


def run(command: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEMCHAT, command], env=cli_env(data_dir), capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("command", ["migrate", "serve"])
def test_a_file_that_is_not_a_database_is_one_line(command: str, tmp_path: Path) -> None:
    garbage = bytes(range(256)) * 64
    (tmp_path / "memchat.db").write_bytes(garbage)
    result = run(command, tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        2,
        "",
        f"memchat {command}: the database file {tmp_path / 'memchat.db'} cannot be used: "
        f"file is not a database. {ADVICE}\n",
    )
    assert (tmp_path / "memchat.db").read_bytes() == garbage


def test_a_damaged_database_is_one_line(tmp_path: Path) -> None:
    assert run("migrate", tmp_path).returncode == 0
    with (tmp_path / "memchat.db").open("r+b") as handle:  # its pages, not its header
        handle.seek(100)
        handle.write(b"\xff" * 3000)
    result = run("migrate", tmp_path)
    assert (result.returncode, result.stderr) == (
        2,
        f"memchat migrate: the database file {tmp_path / 'memchat.db'} cannot be used: "
        f"database disk image is malformed. {ADVICE}\n",
    )
