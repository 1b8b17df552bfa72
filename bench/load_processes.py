"""Load through a load balancer in front of two API processes, one of them killed and
restarted mid-run, against one process alone, in the same run.

Each phase gets a fresh PostgreSQL database. Phase "one process": `memchat serve` alone.
Phase "two processes": two `memchat serve` (own data dirs, the default llama.cpp engine
each) behind haproxy (round robin, health checks on /readyz); process A is killed with
SIGKILL at `--kill-at` seconds and started again at `--restart-at`. In both phases
`--users` simulated users import 5 turns, search and chat in a loop through the front
address (the workload of bench/load.py), and read-after-write probes write a turn
through one process and search for it through the other at once (phase two only: with
one process there is no other). At the end every acknowledged message is looked for in
SQL (lost: acknowledged but not stored; duplicated: stored more often than
acknowledged) and every probe whose turn was not found is a stale read.

    .venv/bin/python bench/load_processes.py [--users 50] [--seconds 60] [--probe-lanes 4]

Needs haproxy on PATH (`make haproxy`) and the PostgreSQL server of
MEMCHAT_STACK_POSTGRES_URL (default postgresql+asyncpg://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
from load import Stats, percentile, simulate_user, verify
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

ADMIN_URL = os.environ.get(
    "MEMCHAT_STACK_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
HAPROXY = """global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    retries 2
    option redispatch
frontend api
    bind 127.0.0.1:{front}
    default_backend apps
backend apps
    balance roundrobin
    # HTTP/1.1 with a loopback Host: in local mode (no API keys) the app answers no other.
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost
    http-check expect status 200
    default-server inter 1s fall 2 rise 2
{servers}
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def admin(statement: str) -> None:
    engine = create_async_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    async with engine.connect() as connection:
        await connection.execute(text(statement))
    await engine.dispose()


class App:
    """One `memchat serve` process that can be killed and started again."""

    def __init__(self, root: Path, name: str, database_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
        self.env |= {
            "MEMCHAT_DATABASE_URL": database_url,
            "MEMCHAT_DATA_DIR": str(root / name),
            "MEMCHAT_PORT": str(self.port),
            "MEMCHAT_LOG_LEVEL": "warning",
            "MEMCHAT_ENGINE__TIMEOUT_S": "600",
        }
        self.log = root / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve"],
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )

    async def ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2) as client:
            while time.monotonic() < deadline:
                try:
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"{self.url} not ready; see {self.log}")

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


async def balanced(front: str, timeout_s: float = 60) -> None:
    """Until the balancer answers readiness from both processes, in turn (round robin):
    its health checks have put both in rotation."""
    deadline = time.monotonic() + timeout_s
    in_a_row = 0
    async with httpx.AsyncClient(timeout=2) as client:
        while in_a_row < 4:
            if time.monotonic() > deadline:
                raise RuntimeError("the balancer has no process in rotation")
            try:
                ok = (await client.get(f"{front}/readyz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            in_a_row = in_a_row + 1 if ok else 0
            await asyncio.sleep(0.5)


async def probe(writer: str, reader: str, number: int, counts: Counter[str]) -> None:
    """A turn written through one process, searched for at once through the other."""
    user = f"probe{number % 5}"
    word = f"zq{uuid.uuid4().hex[:10]}"
    async with httpx.AsyncClient(timeout=60) as client:
        try:
            session = await client.post(f"{writer}/v1/sessions", json={"user_id": user})
            if session.status_code != 201:
                counts["write refused"] += 1
                return
            content = f"My locker code word is {word}."
            written = await client.post(
                f"{writer}/v1/sessions/{session.json()['id']}/history",
                json={"messages": [{"role": "user", "content": content}]},
            )
            if written.status_code != 201:
                counts["write refused"] += 1
                return
            found = await client.post(
                f"{reader}/v1/memory/search",
                json={"user_id": user, "query": f"locker code word {word}", "k": 3},
            )
        except httpx.HTTPError:
            counts["no answer"] += 1
            return
    if found.status_code != 200:
        counts["read refused"] += 1
    elif any(r["text"] == content for r in found.json()["results"]):
        counts["fresh"] += 1
    else:
        counts["stale"] += 1


async def probes(
    apps: list[App], deadline: float, counts: Counter[str], lane: int, num_lanes: int
) -> None:
    """One of `num_lanes` probe loops; each writes through A and reads through B, then
    the other way round."""
    number = lane
    while time.monotonic() < deadline:
        writer, reader = (apps[0], apps[1]) if number % 2 == 0 else (apps[1], apps[0])
        await probe(writer.url, reader.url, number, counts)
        number += num_lanes
        await asyncio.sleep(0.2)


async def chaos(app: App, kill_at: float, restart_at: float, events: list[str]) -> None:
    started = time.monotonic()
    await asyncio.sleep(kill_at)
    app.kill()
    events.append(f"killed A at {time.monotonic() - started:.1f} s")
    await asyncio.sleep(max(0.0, restart_at - (time.monotonic() - started)))
    app.start()
    await app.ready()
    events.append(f"A ready again at {time.monotonic() - started:.1f} s")


async def workload(front: str, users: int, seconds: float, extra: list) -> tuple[Stats, dict]:
    stats = Stats()
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    async with httpx.AsyncClient(base_url=front, timeout=300, limits=limits) as client:
        deadline = time.monotonic() + seconds
        names = [f"user{n:03d}" for n in range(users)]
        results = await asyncio.gather(
            *(simulate_user(n, client, stats, deadline) for n in names),
            *(task(deadline) for task in extra),
        )
        sessions = dict(zip(names, results[: len(names)], strict=True))
        lost, duplicated = await verify(client, sessions, stats)
    return stats, {"lost": lost, "duplicated": duplicated}


async def phase(name: str, root: Path, args: argparse.Namespace) -> dict:
    database = f"memchat_load_{uuid.uuid4().hex[:10]}"
    await admin(f'CREATE DATABASE "{database}"')
    url = f"{ADMIN_URL.rpartition('/')[0]}/{database}"
    two = name == "two processes"
    apps = [App(root, f"{name[:3]}-{n}", url) for n in ("a", "b")[: 2 if two else 1]]
    balancer: subprocess.Popen[bytes] | None = None
    counts: Counter[str] = Counter()
    events: list[str] = []
    try:
        apps[0].start()
        await apps[0].ready()  # migrates the database before the second process starts
        for app in apps[1:]:
            app.start()
            await app.ready()
        front = apps[0].url
        extra = []
        if two:
            port = free_port()
            servers = "\n".join(
                f"    server {chr(97 + i)} 127.0.0.1:{a.port} check" for i, a in enumerate(apps)
            )
            config = root / f"haproxy-{port}.cfg"
            config.write_text(HAPROXY.format(front=port, servers=servers))
            balancer = subprocess.Popen(["haproxy", "-f", str(config)])
            front = f"http://127.0.0.1:{port}"
            await balanced(front)

            async def run_probes(deadline: float) -> None:
                await asyncio.gather(
                    *(
                        probes(apps, deadline, counts, lane, args.probe_lanes)
                        for lane in range(args.probe_lanes)
                    )
                )

            async def run_chaos(_deadline: float) -> None:
                await chaos(apps[0], args.kill_at, args.restart_at, events)

            extra = [run_probes, run_chaos]
        started = time.perf_counter()
        stats, checks = await workload(front, args.users, args.seconds, extra)
        elapsed = time.perf_counter() - started
    finally:
        if balancer is not None:
            balancer.terminate()
            balancer.wait()
        for app in apps:
            app.stop()
        await admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    acknowledged = sum(len(v) for v in stats.acknowledged.values())
    return {
        "name": name,
        "elapsed": elapsed,
        "stats": stats,
        "acknowledged": acknowledged,
        "probes": counts,
        "events": events,
        **checks,
    }


def report(result: dict) -> None:
    stats: Stats = result["stats"]
    total = sum(len(v) for v in stats.latencies.values())
    print(f"\n## {result['name']}: {result['elapsed']:.0f} s, {total} requests")
    for event in result["events"]:
        print(f"  {event}")
    print("| operation | n | p50 ms | p95 ms | p99 ms | statuses |")
    print("|---|---|---|---|---|---|")
    for endpoint, values in stats.latencies.items():
        ms = [v * 1000 for v in values]
        statuses = ", ".join(
            f"{s or 'conn'}: {n}" for s, n in sorted(stats.statuses[endpoint].items())
        )
        print(
            f"| {endpoint} | {len(ms)} | {percentile(ms, 0.5):.0f} | {percentile(ms, 0.95):.0f} "
            f"| {percentile(ms, 0.99):.0f} | {statuses} |"
        )
    probes_seen = dict(result["probes"]) or "none (one process)"
    print(
        f"acknowledged messages {result['acknowledged']}, lost {result['lost']}, duplicated "
        f"{result['duplicated']}; read-after-write probes {probes_seen}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--probe-lanes", type=int, default=4, help="probe loops at once")
    parser.add_argument("--kill-at", type=float, default=20.0)
    parser.add_argument("--restart-at", type=float, default=30.0)
    args = parser.parse_args()
    if shutil.which("haproxy") is None:
        raise SystemExit("haproxy is not on PATH: `make haproxy` installs it")
    with tempfile.TemporaryDirectory(prefix="memchat-load-") as scratch:
        for name in ("one process", "two processes"):
            report(asyncio.run(phase(name, Path(scratch), args)))


if __name__ == "__main__":
    main()
