"""Peak memory of `memchat export` (and of import) against the number of messages.

Fills a SQLite store with messages of one user, written in bulk through the
repositories (sessions of 1,000 turns; every user turn carries a context note of three
passages and the ids of five earlier turns, as a turn with retrieved memories does; no
vectors: export reads none), and after each size runs `memchat export --user-id bench`
in a fresh process, measuring its peak resident memory (ru_maxrss of the child, read by
a wrapper process of its own) and its time. A flat column means the export streams.

Then the import of each file into a fresh store, in a fresh process, with a hash
embedder (a fake: 64 dimensions, no model; labelled so in the table) so that the
numbers are about the import, not the model; and, with `--real-import N`, `memchat
import` of the N-message files with the real default embedder (slow on small machines;
N among the sizes). A third series imports into no vector index at all: the memory of
the import itself.
The import writes as `memchat import` does (`vectors_only`: vectors in SQL and in the
FAISS scope file, no in-memory lexical index); its memory includes the FAISS scope it
fills, which holds every vector of the user by design (64 floats a turn with the fake,
384 with the real model), while the file and the rows are read and written a batch at
a time.

    .venv/bin/python bench/export_memory.py [--sizes 10000 50000 100000] [--real-import 10000 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.protocols import IndexLoadResult
from storage import migrate
from storage.db import Database, create_engine, sqlite_url
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn, Session
from storage.repositories import Repositories

ROOT = Path(__file__).resolve().parents[1]
USER = "bench"
TURNS_PER_SESSION = 1000
BATCH = 2000
VOCABULARY = (
    "garden kite river morning doctor appointment daughter birthday Berlin Paris recipe "
    "peanut allergy train ticket holiday mountain owl museum violin lesson budget rent "
    "project deadline coffee tea weekend market bicycle repair window neighbour dog walk"
)
WORDS = VOCABULARY.split()

# Runs the command given as arguments and prints its peak RSS (KiB) and wall time.
WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "wall = time.perf_counter() - start\n"
    "if done.returncode: sys.stderr.write(done.stderr.decode()); sys.exit(done.returncode)\n"
    "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(json.dumps({'rss_kib': rss, 'wall_s': wall}))\n"
)


def text(number: int, words: int) -> str:
    rng = np.random.default_rng(number)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), words))


def turn(number: int) -> NewTurn:
    """Turn `number` (0-based, id `number + 1` in a fresh store): users ask with a context
    note showing the five turns before, assistants answer."""
    if number % 2:
        return NewTurn(role="assistant", content=text(number, 30), token_count=40)
    note = [f"- memory: {text(number * 7 + k, 40)}" for k in range(3)]
    return NewTurn(
        role="user",
        content=text(number, 25),
        token_count=32,
        external_id=f"m{number}",
        context_note=note,
        context_note_tokens=160,
        context_note_ids=list(range(number - 4, number + 1)) if number >= 5 else [],
    )


async def fill(url: str, have: int, want: int) -> None:
    """Top the bench user up from `have` to `want` messages, a batch per transaction."""
    db = Database.open(url)
    repos = Repositories.of(db)
    try:
        chat: Session | None = None
        if have % TURNS_PER_SESSION:
            sessions = await repos.sessions.list_sessions(USER, tenant_id=DEFAULT_TENANT_ID)
            chat = sessions[-1][0]
        number = have
        while number < want:
            if number % TURNS_PER_SESSION == 0:
                chat, _user = await repos.sessions.create_session(
                    USER, None, {}, tenant_id=DEFAULT_TENANT_ID
                )
            assert chat is not None
            count = min(BATCH, want - number, TURNS_PER_SESSION - number % TURNS_PER_SESSION)
            await repos.messages.append(chat, [turn(number + i) for i in range(count)])
            number += count
    finally:
        await db.dispose()


def env_for(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
    return env | {"MEMCHAT_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1"}


def measure(command: list[str], env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout))


class HashEmbedder:
    """A fake embedder (hashed words, 64 dimensions): the import without a model's cost."""

    model_name = "hash-64"
    dimension = 64

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        matrix = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, item in enumerate(texts):
            for word in item.split():
                bucket = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest())
                matrix[row, bucket % self.dimension] += 1.0
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / np.where(norms > 0, norms, 1.0)


class NullIndex:
    """A vector index that keeps nothing: the import's own memory, without FAISS's."""

    dimension = 64

    def __init__(self) -> None:
        self._loaded: set[int] = set()

    def is_loaded(self, scope: int) -> bool:
        return scope in self._loaded

    async def load(self, scope: int) -> IndexLoadResult:
        self._loaded.add(scope)
        return IndexLoadResult("missing")

    async def add(self, scope: int, ids: Sequence[int], vectors: np.ndarray) -> None:
        self._loaded.add(scope)

    async def remove(self, scope: int, ids: object) -> None:
        return None

    async def save(self) -> None:
        return None


async def child_import(data_dir: Path, path: Path, index_kind: str) -> None:
    """Run in the measured process: import `path` with the fake embedder, into FAISS or
    into no vector index (`index_kind` "none")."""
    from app.cli.backup import ImportTarget, import_lines, vectors_only
    from retrieval.indexes.faiss import FaissIndex
    from retrieval.knowledge.base import KnowledgeBase, KnowledgeConfig
    from retrieval.search.memory import RetrievalConfig, TurnMemory

    url = sqlite_url(data_dir)
    engine = create_engine(url)
    await migrate.upgrade(engine)
    repos = Repositories.of(Database(engine))
    embedder = HashEmbedder()
    index: Any = FaissIndex(data_dir / "turns", 64) if index_kind == "faiss" else NullIndex()
    config = vectors_only(RetrievalConfig())  # as `memchat import` runs it
    memory = TurnMemory(repos.messages, repos.embeddings, embedder, index, config)

    def knowledge() -> KnowledgeBase:
        index = FaissIndex(data_dir / "knowledge", 64)
        return KnowledgeBase(repos.knowledge, embedder, index, KnowledgeConfig())

    target = ImportTarget(repos.backup, repos.facts, memory, knowledge, DEFAULT_TENANT_ID)
    with path.open("rb") as lines:
        counts = await import_lines(target, lines)
    assert counts.num_added["messages"] > 0
    await engine.dispose()


def row(label: str, size: int, result: dict[str, float], file_mib: float | None = None) -> str:
    mib = result["rss_kib"] / 1024
    extra = f"{file_mib:9.1f}" if file_mib is not None else " " * 9
    return f"| {label:<39} | {size:>8,} | {mib:9.1f} | {result['wall_s']:8.1f} | {extra} |"


async def main(sizes: list[int], real_import: list[int]) -> None:
    with tempfile.TemporaryDirectory(prefix="memchat-export-bench-") as tmp:
        root = Path(tmp)
        data = root / "source"
        url = sqlite_url(data)
        engine = create_engine(url)
        await migrate.upgrade(engine)
        await engine.dispose()
        lines = [
            "| run | messages | peak RSS MiB | wall s | file MiB |",
            "|---|---:|---:|---:|---:|",
        ]
        files: dict[int, Path] = {}
        # The baseline: the same command for a user with one session and no messages.
        db = Database.open(url)
        await Repositories.of(db).sessions.create_session(
            "empty", None, {}, tenant_id=DEFAULT_TENANT_ID
        )
        await db.dispose()
        export = [sys.executable, "-m", "app.cli", "export", "--no-progress", "--user-id"]
        empty = measure([*export, "empty", "--output", str(root / "empty.jsonl")], env_for(data))
        lines.append(row("memchat export (empty user)", 0, empty))
        have = 0
        for size in sorted(sizes):
            started = time.perf_counter()
            await fill(url, have, size)
            have = size
            print(f"filled {size:,} messages in {time.perf_counter() - started:.0f} s", flush=True)
            path = root / f"export-{size}.jsonl"
            result = measure([*export, USER, "--output", str(path)], env_for(data))
            files[size] = path
            lines.append(row("memchat export", size, result, path.stat().st_size / 2**20))
            print(lines[-1], flush=True)
        for kind, label in (("faiss", "fake embedder, FAISS"), ("none", "fake, no vector index")):
            for size, path in sorted(files.items()):
                target = root / f"import-{kind}-{size}"
                command = [sys.executable, str(Path(__file__).resolve()), "--child-import"]
                result = measure([*command, str(target), str(path), kind], env_for(target))
                lines.append(row(f"import, {label}", size, result))
                print(lines[-1], flush=True)
        if real_import:
            # The first start exports the model to ONNX (with torch): a one-off, not measured.
            warm = root / "import-real"
            command = [sys.executable, "-m", "app.cli", "import", "--no-progress"]
            measure([*command, str(root / "empty.jsonl")], env_for(warm))
            result = measure([*command, str(root / "empty.jsonl")], env_for(warm))
            lines.append(row("memchat import, real model, empty user", 0, result))
            for size in real_import:
                target = root / f"import-real-{size}"
                target.mkdir()
                # The ONNX file is cached under the data directory: share the warm one.
                (target / "models").symlink_to(warm / "models")
                result = measure([*command, str(files[size])], env_for(target))
                lines.append(row("memchat import, all-MiniLM-L6-v2 (real)", size, result))
                print(lines[-1], flush=True)
        print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--real-import", type=int, nargs="*", default=[], metavar="N")
    parser.add_argument("--child-import", nargs=3, metavar=("DATA_DIR", "FILE", "INDEX"))
    options = parser.parse_args()
    if options.child_import:
        data_dir, path, index_kind = options.child_import
        asyncio.run(child_import(Path(data_dir), Path(path), index_kind))
    else:
        asyncio.run(main(options.sizes, options.real_import))
