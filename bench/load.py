"""Load test: N simulated users on loopback, each importing, searching and chatting.

Starts `memchat serve` on a fresh data dir (real default stack) unless --url is given,
runs for a bounded time, then checks that every acknowledged message is stored exactly
once. Prints throughput, p50/p95/p99 latency per endpoint and status counts.

    .venv/bin/python bench/load.py [--users 50] [--seconds 60] [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _server import start_server


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    # user -> content of every message the API acknowledged (2xx) as stored
    acknowledged: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    # client-side failures (no HTTP answer), by exception class
    failures: Counter[str] = field(default_factory=Counter)

    def record(self, endpoint: str, started: float, status: int) -> None:
        self.latencies[endpoint].append(time.perf_counter() - started)
        self.statuses[endpoint][status] += 1


async def call(
    stats: Stats, client: httpx.AsyncClient, endpoint: str, method: str, url: str, body: dict
) -> httpx.Response | None:
    started = time.perf_counter()
    try:
        response = await client.request(method, url, json=body)
    except httpx.HTTPError as exc:
        stats.record(endpoint, started, 0)
        stats.failures[f"{endpoint}: {type(exc).__name__} {exc}"[:120]] += 1
        return None
    stats.record(endpoint, started, response.status_code)
    return response


async def simulate_user(user: str, client: httpx.AsyncClient, stats: Stats, deadline: float) -> str:
    created = await call(stats, client, "create session", "POST", "/v1/sessions", {"user_id": user})
    assert created is not None and created.status_code == 201, created
    session = created.json()["id"]
    round_number = 0
    while time.monotonic() < deadline:
        history = [
            {
                "role": "user",
                "content": f"{user} note {round_number}-{i}: I like colour {i}.",
                "external_id": f"{user}-{round_number}-{i}",
            }
            for i in range(5)
        ]
        imported = await call(
            stats, client, "import 5", "POST", f"/v1/sessions/{session}/history",
            {"messages": history},
        )  # fmt: skip
        if imported is not None and imported.status_code == 201:
            stats.acknowledged[user] += [m["content"] for m in history]
        await call(
            stats, client, "search", "POST", "/v1/memory/search",
            {"user_id": user, "query": f"which colour does {user} like", "k": 5},
        )  # fmt: skip
        content = f"{user} asks question {round_number}: what do I like?"
        turn = await call(
            stats, client, "chat turn", "POST", f"/v1/sessions/{session}/messages",
            {"content": content, "max_tokens": 8, "temperature": 0},
        )  # fmt: skip
        if turn is not None and turn.status_code == 200:
            stats.acknowledged[user] += [content, turn.json()["reply"]["content"]]
        elif turn is not None and turn.status_code == 503:
            await asyncio.sleep(float(turn.headers.get("retry-after", "1")))
        round_number += 1
    return session


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def verify(
    client: httpx.AsyncClient, sessions: dict[str, str], stats: Stats
) -> tuple[int, int]:
    lost = duplicated = 0
    for user, session in sessions.items():
        stored = await client.get(f"/v1/sessions/{session}/messages", params={"limit": 10_000})
        counts = Counter(m["content"] for m in stored.json()["messages"])
        expected = Counter(stats.acknowledged[user])
        lost += sum(max(0, n - counts[text]) for text, n in expected.items())
        duplicated += sum(max(0, counts[text] - n) for text, n in expected.items())
        ids = [m["id"] for m in stored.json()["messages"]]
        duplicated += len(ids) - len(set(ids))
    return lost, duplicated


async def run(url: str, users: int, seconds: float) -> None:
    stats = Stats()
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        deadline = time.monotonic() + seconds
        started = time.perf_counter()
        names = [f"user{n:03d}" for n in range(users)]
        results = await asyncio.gather(*(simulate_user(n, client, stats, deadline) for n in names))
        elapsed = time.perf_counter() - started
        lost, duplicated = await verify(client, dict(zip(names, results, strict=True)), stats)
    total = sum(len(v) for v in stats.latencies.values())
    print(f"{users} users, {elapsed:.1f} s, {total} requests, {total / elapsed:.1f} requests/s")
    for endpoint, values in stats.latencies.items():
        ms = [v * 1000 for v in values]
        statuses = ", ".join(
            f"{s or 'conn'}: {n}" for s, n in sorted(stats.statuses[endpoint].items())
        )
        print(
            f"  {endpoint:<15} n={len(ms):5d}  p50 {percentile(ms, 0.5):8.1f} ms  p95 "
            f"{percentile(ms, 0.95):8.1f} ms  p99 {percentile(ms, 0.99):8.1f} ms  [{statuses}]"
        )
    acknowledged = sum(len(v) for v in stats.acknowledged.values())
    for failure, count in stats.failures.items():
        print(f"  no answer x{count}: {failure}")
    print(f"acknowledged messages: {acknowledged}; lost: {lost}; duplicated: {duplicated}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    args = parser.parse_args()
    if args.url:
        asyncio.run(run(args.url, args.users, args.seconds))
        return
    with tempfile.TemporaryDirectory() as data_dir:
        process, url = start_server(Path(data_dir))
        try:
            asyncio.run(run(url, args.users, args.seconds))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


if __name__ == "__main__":
    main()
