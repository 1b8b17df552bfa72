"""Resident memory of one API process against the number of users it has open, and the
first search of a user whose scope was closed.

Fills a SQLite store with `--users` users of `--turns` turns each (LoCoMo dialogue
turns, cycled; random unit vectors of the default embedder's dimension stored as their
vectors, written in bulk: no embedding), then in a fresh process per cap
(`retrieval.max_open_users`) searches every user once (the hybrid search of the service:
FAISS, BM25 with its related-word vocabulary), and reports the process's resident
memory (VmRSS) and the open scopes. In the capped process it then times the first
search of users closed long ago (their FAISS file read, reconciled with SQL, lexical
index and vocabulary rebuilt) against searches of open users.

Queries are embedded by a hashing embedder of the same dimension (labelled), so that the
figures are the indexes' own, not the model's (the default embedder adds its ~90 MB
once per process, whatever the number of users).

    .venv/bin/python bench/open_users.py [--users 10000] [--turns 100] [--caps 1000 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import insert

from retrieval.indexes.faiss import FaissIndex
from retrieval.search.memory import RetrievalConfig, TurnMemory
from storage import migrate
from storage.db import Database, create_engine
from storage.models import DEFAULT_TENANT_ID, ChatSession, Message, MessageEmbedding, User
from storage.repositories import Repositories

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo10_dev.json"
DIMENSION = 384
BATCH = 20_000


class HashingEmbedder:
    """Words hashed into a fixed number of dimensions (not a model): a cheap, stable query
    vector of the right dimension."""

    model_name = "all-MiniLM-L6-v2"
    dimension = DIMENSION

    async def embed(self, texts: list[str]) -> np.ndarray:
        matrix = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                matrix[row, int.from_bytes(digest, "little") % DIMENSION] += 1.0
            norm = np.linalg.norm(matrix[row])
            matrix[row] /= norm if norm > 0 else 1.0
        return matrix


def locomo_texts() -> list[str]:
    conversations = json.loads(DATA.read_text(encoding="utf-8"))
    texts = []
    for item in conversations:
        conversation = item["conversation"]
        for key in sorted(k for k in conversation if k.startswith("session_") and "date" not in k):
            texts += [turn["text"] for turn in conversation[key]]
    return texts


async def fill(url: str, num_users: int, num_turns: int) -> None:
    engine = create_engine(url)
    await migrate.upgrade(engine)
    texts = locomo_texts()
    rng = np.random.default_rng(7)
    now = time.time()
    import datetime as dt

    created = dt.datetime.fromtimestamp(now, dt.UTC)
    message_id = 0
    async with engine.begin() as connection:
        await connection.execute(
            insert(User),
            [
                {"id": u + 1, "tenant_id": DEFAULT_TENANT_ID, "external_id": f"user-{u}",
                 "created_at": created}
                for u in range(num_users)
            ],
        )  # fmt: skip
        await connection.execute(
            insert(ChatSession),
            [
                {"id": f"00000000-0000-4000-8000-{u + 1:012d}", "user_pk": u + 1,
                 "metadata_json": {}, "created_at": created}
                for u in range(num_users)
            ],
        )  # fmt: skip
    messages: list[dict[str, object]] = []
    vectors: list[dict[str, object]] = []

    async def flush() -> None:
        async with engine.begin() as connection:
            await connection.execute(insert(Message), messages)
            await connection.execute(insert(MessageEmbedding), vectors)
        messages.clear()
        vectors.clear()

    for u in range(num_users):
        block = rng.standard_normal((num_turns, DIMENSION)).astype(np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        for seq in range(num_turns):
            message_id += 1
            text = texts[(u * num_turns + seq) % len(texts)]
            messages.append(
                {"id": message_id, "session_id": f"00000000-0000-4000-8000-{u + 1:012d}",
                 "user_pk": u + 1, "seq": seq + 1, "role": "user" if seq % 2 == 0 else "assistant",
                 "content": text, "token_count": len(text.split()), "created_at": created}
            )  # fmt: skip
            vectors.append(
                {"message_id": message_id, "user_pk": u + 1, "model": HashingEmbedder.model_name,
                 "dimension": DIMENSION, "vector": block[seq].tobytes()}
            )  # fmt: skip
        if len(messages) >= BATCH:
            await flush()
    if messages:
        await flush()
    await engine.dispose()


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(url: str, index_dir: Path, cap: int, num_users: int, probes: int) -> dict:
    engine = create_engine(url)
    repos = Repositories.of(Database(engine))
    embedder = HashingEmbedder()
    config = RetrievalConfig(max_open_users=cap)
    memory = TurnMemory(
        repos.messages,
        repos.embeddings,
        embedder,  # type: ignore[arg-type]
        FaissIndex(index_dir, DIMENSION),
        config,
    )
    queries = locomo_texts()
    base = resident_mb()
    started = time.perf_counter()
    for user_pk in range(1, num_users + 1):
        vector = (await embedder.embed([queries[user_pk % len(queries)]]))[0]
        await memory.search(user_pk, vector, 10, query=queries[user_pk % len(queries)])
    fill_s = time.perf_counter() - started
    result = {
        "cap": cap,
        "open_users": memory.num_open_users,
        "rss_mb": round(resident_mb(), 1),
        "rss_before_mb": round(base, 1),
        "first_pass_s": round(fill_s, 1),
    }

    async def timed(user_pk: int) -> float:
        query = queries[(user_pk * 7) % len(queries)]
        vector = (await embedder.embed([query]))[0]
        start = time.perf_counter()
        await memory.search(user_pk, vector, 10, query=query)
        return (time.perf_counter() - start) * 1000

    open_users = list(range(num_users - probes + 1, num_users + 1))
    warm = [await timed(u) for u in open_users]
    result["open_search_ms_p50"] = round(statistics.median(warm), 2)
    result["open_search_ms_p95"] = round(statistics.quantiles(warm, n=20)[18], 2)
    if cap < num_users:
        closed = [await timed(u) for u in range(1, probes + 1)]
        result["closed_first_search_ms_p50"] = round(statistics.median(closed), 2)
        result["closed_first_search_ms_p95"] = round(statistics.quantiles(closed, n=20)[18], 2)
    await memory.save()
    await engine.dispose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--caps", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--measure", nargs=3, metavar=("URL", "INDEX_DIR", "CAP"))
    args = parser.parse_args()
    if args.measure:
        url, index_dir, cap = args.measure
        found = asyncio.run(measure(url, Path(index_dir), int(cap), args.users, args.probes))
        print(json.dumps(found))
        return
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/store.db"
        started = time.perf_counter()
        asyncio.run(fill(url, args.users, args.turns))
        print(
            f"stored {args.users} users x {args.turns} turns in "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        rows = []
        for cap in args.caps:
            # A fresh process per cap: resident memory is the process's own.
            command = [
                sys.executable, __file__, "--users", str(args.users), "--probes",
                str(args.probes), "--measure", url, f"{tmp}/index-{cap}", str(cap),
            ]  # fmt: skip
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    print()
    print("| max_open_users | open users | resident MB | first pass s | open search p50/p95 ms "
          "| closed user's first search p50/p95 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for row in rows:
        closed = (
            f"{row['closed_first_search_ms_p50']} / {row['closed_first_search_ms_p95']}"
            if "closed_first_search_ms_p50" in row
            else "-"
        )
        print(
            f"| {row['cap']} | {row['open_users']} | {row['rss_mb']} | {row['first_pass_s']} "
            f"| {row['open_search_ms_p50']} / {row['open_search_ms_p95']} | {closed} |"
        )


if __name__ == "__main__":
    main()
