"""Event-loop lag of one API process under concurrent chat turns on a vLLM server.

One API process (SQLite, FAISS, engine.kind=vllm) on one local vLLM CPU server, built
as `memchat serve` builds it and run by uvicorn on its usual event loop (uvloop), with
one more task on that loop: every 10 ms it sleeps 10 ms and records how late it woke up.
That delay is the loop's lag: the time any request of the process waits before the loop
gets to it, because something else held the loop (a synchronous call in an adapter, CPU
work, a garbage collection). While `--concurrency` users each run `--turns` chat turns
back to back (so that many turns are in flight at once), from another process, the
samples of the loaded period are kept; a few idle seconds before give the baseline.

`--tree DIR` serves the app from another checkout of the project (for example a
`git worktree` of an earlier commit) with this environment's packages, so that two trees
are measured against the same vLLM server in one run:

    git worktree add /tmp/before 0c31429
    .venv/bin/python bench/loop_lag.py --tree /tmp/before --tree .

The trees take turns, `--rounds` times, each on a fresh data dir; the figures pool every
round of a tree. Needs `make vllm` (the local vLLM environment).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from _server import REPO, local_vllm, wait_until_ready

TICK_S = 0.010
QUESTIONS = [
    "I moved to Lisbon last spring and I am learning Portuguese.",
    "What would be a good weekend trip from where I live?",
    "我最近在学做川菜，你有什么建议吗？",
    "Remind me what language I am learning.",
]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


# The API process ---------------------------------------------------------------------


def serve_monitored(port: int, samples: Path) -> None:
    """Runs in the API process: the tree's app (as its `memchat serve` builds it) on
    uvicorn's loop, beside the lag monitor, until SIGTERM."""
    import uvicorn

    from app.settings import Settings

    try:
        from app.cli.serving import serving_app as build
    except ImportError:  # a tree from before the serving module
        from app.factory import create_app as build

    config = uvicorn.Config(build(Settings()), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)

    async def monitor() -> None:
        # perf_counter, not loop.time(): uvloop's clock counts whole milliseconds.
        with samples.open("w", buffering=1) as out:
            while True:
                started = time.perf_counter()
                await asyncio.sleep(TICK_S)
                lag_ms = (time.perf_counter() - started - TICK_S) * 1000
                out.write(f"{time.time():.4f} {lag_ms:.3f}\n")

    async def main() -> None:
        watching = asyncio.create_task(monitor())
        try:
            await server.serve()
        finally:
            watching.cancel()

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(main())


# The driver ----------------------------------------------------------------------------


@contextmanager
def given(url: str) -> Iterator[str]:
    yield url


@contextmanager
def served(tree: Path, vllm_url: str, data_dir: Path, port: int) -> Iterator[str]:
    """The API process of `tree` (its modules first on the path, this venv's packages),
    migrated first, stopped with SIGTERM at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
    env |= {
        "PYTHONPATH": str(tree),
        "MEMCHAT_DATA_DIR": str(data_dir),
        "MEMCHAT_LOG_LEVEL": "warning",
        "MEMCHAT_ENGINE__KIND": "vllm",
        "MEMCHAT_VLLM_URLS": vllm_url,
        "MEMCHAT_ENGINE__TIMEOUT_S": "600",
        "MEMCHAT_ACCESS__REQUESTS_PER_MINUTE": "0",
        # Every user's turn in flight at once (the default queue bound is 8).
        "MEMCHAT_CHAT__MAX_PENDING_TURNS": "64",
    }
    log = (data_dir / "serve.log").open("wb")
    subprocess.run(
        [sys.executable, "-m", "app.cli", "migrate"], cwd=tree, env=env, stdout=log, check=True
    )
    command = [sys.executable, __file__, "--serve-port", str(port), "--samples", "lag.txt"]
    process = subprocess.Popen(command, cwd=data_dir, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_ready(url, process, timeout_s=300)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc} (the app of {tree}): see {log.name}") from exc
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


async def user(client: httpx.AsyncClient, number: int, turns: int) -> list[float]:
    created = await client.post("/v1/sessions", json={"user_id": f"lag-{number}"})
    created.raise_for_status()
    session = created.json()["id"]
    durations = []
    for turn in range(turns):
        started = time.perf_counter()
        answer = await client.post(
            f"/v1/sessions/{session}/messages",
            json={
                "content": QUESTIONS[(number + turn) % len(QUESTIONS)],
                "max_tokens": 24,
                "temperature": 0,
            },
        )
        if answer.status_code != 200:
            raise RuntimeError(f"turn {turn} of user {number}: {answer.status_code} {answer.text}")
        durations.append(time.perf_counter() - started)
    return durations


async def load(url: str, args: argparse.Namespace) -> tuple[float, float, list[float]]:
    """(idle start, load start, load end) as wall-clock times, and the turns' durations."""
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        idle_start = time.time()
        await asyncio.sleep(args.idle_s)
        load_start = time.time()
        turns = await asyncio.gather(
            *(user(client, n, args.turns) for n in range(args.concurrency))
        )
        load_end = time.time()
    return (idle_start, load_start, load_end), [t for ts in turns for t in ts]


def read_lags(path: Path, start: float, end: float) -> list[float]:
    lags = []
    for line in path.read_text().splitlines():
        stamp, _, lag = line.partition(" ")
        if start <= float(stamp) <= end:
            lags.append(float(lag))
    return lags


def summary(samples: dict[str, list[float]]) -> dict[str, float]:
    idle, loaded, turns = samples["idle"], samples["loaded"], samples["turns"]
    return {
        "idle lag p50 ms": statistics.median(idle),
        "idle lag p99 ms": percentile(idle, 0.99),
        "samples under load": float(len(loaded)),
        "lag p50 ms": statistics.median(loaded),
        "lag p95 ms": percentile(loaded, 0.95),
        "lag p99 ms": percentile(loaded, 0.99),
        "lag max ms": max(loaded),
        "turns": float(len(turns)),
        "turn p50 s": statistics.median(turns),
        "turn p95 s": percentile(turns, 0.95),
    }


def measure_tree(tree: Path, vllm_url: str, data_dir: Path, args: argparse.Namespace) -> dict:
    with served(tree, vllm_url, data_dir, args.port) as url:
        (idle_start, load_start, load_end), turns = asyncio.run(load(url, args))
        time.sleep(2 * TICK_S)  # the monitor's last sample of the period
    lags = data_dir / "lag.txt"
    return {
        "idle": read_lags(lags, idle_start, load_start),
        "loaded": read_lags(lags, load_start, load_end),
        "turns": turns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", type=Path, help="checkout(s) to serve")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--turns", type=int, default=6, help="turns per user and round")
    parser.add_argument("--rounds", type=int, default=3, help="the trees in turn, this often")
    parser.add_argument("--idle-s", type=float, default=3)
    parser.add_argument("--port", type=int, default=18750)
    parser.add_argument("--vllm-url", help="an already running vLLM server")
    parser.add_argument("--serve-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_port is not None:
        serve_monitored(args.serve_port, args.samples)
        return
    trees = [t.resolve() for t in (args.tree or [REPO])]
    labels = [f"{tree} ({revision(tree)})" for tree in trees]
    pooled = {label: {"idle": [], "loaded": [], "turns": []} for label in labels}
    with tempfile.TemporaryDirectory(prefix="memchat-lag-") as root:
        engine = (
            local_vllm(Path(root) / "vllm.log", port=18741, enforce_eager=True, kv_cache_gib=1)
            if args.vllm_url is None
            else given(args.vllm_url)
        )
        with engine as vllm_url:
            for round_number in range(args.rounds):
                for number, (tree, label) in enumerate(zip(trees, labels, strict=True)):
                    data_dir = Path(root) / f"data-{round_number}-{number}"
                    data_dir.mkdir()
                    measured = measure_tree(tree, vllm_url, data_dir, args)
                    for name, values in measured.items():
                        pooled[label][name].extend(values)
                    row = summary(measured)
                    print(
                        f"round {round_number + 1} {label}: lag p99 {row['lag p99 ms']:.1f} ms, "
                        f"max {row['lag max ms']:.1f} ms, load average {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    print(
        f"\n{args.concurrency} users x {args.turns} turns, {args.rounds} rounds, "
        f"a lag sample every {TICK_S * 1000:g} ms"
    )
    print("| tree | samples | lag p50 / p95 / p99 / max ms | idle lag p99 ms | turn p50 / p95 s |")
    print("|---|---|---|---|---|")
    for label in labels:
        row = summary(pooled[label])
        lag = " / ".join(f"{row[f'lag {p} ms']:.1f}" for p in ("p50", "p95", "p99", "max"))
        turns = f"{row['turn p50 s']:.2f} / {row['turn p95 s']:.2f}"
        count = int(row["samples under load"])
        print(f"| {label} | {count} | {lag} | {row['idle lag p99 ms']:.1f} | {turns} |")


def revision(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    main()
