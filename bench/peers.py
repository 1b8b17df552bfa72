"""memchat beside the memory libraries users would pick instead, on the same data and
machine, doing the same job: store a user's turns (no LLM on the write path), find the
right ones for a new message, and how fast.

Systems: memchat through its REST API (the service in process, default settings: both
dense lists, BM25, FAISS, SQLite); and, each in `.venv-peers` (`make bench-peers`
installs it; never the service's environment), run by `bench/peers_worker.py`: plain
FAISS over all-MiniLM-L6-v2, plain BM25 (`rank-bm25`), llama-index-core's
`VectorStoreIndex`, mem0 OSS (`infer=False`, its local Qdrant). Every peer embeds with
all-MiniLM-L6-v2 from the same package directory.

Data (the same turns, questions and k for every system; `../shared/data`):
- LoCoMo dev (4 conversations, each one user; a turn is `Speaker: text`, as memory
  benchmarks feed LoCoMo to such libraries; memchat gets the text with the speaker as
  the message's `name`, which its index renders the same way); questions of categories
  1-4 with evidence; recall@5/10/20 per category.
- MADial-Bench zh and en, official protocol (a dialogue's candidates are its user's
  memories; the query is the raw dialogue before the test turn); recall@1/3/5/10.
- `bench/labelled/small_store.jsonl`: top-1 / top-3.
- At scale: one user with `--large` LoCoMo turns (cycled): the write rate, search
  latency p50/p95/p99 over 200 LoCoMo questions, and the resident memory after loading
  (memchat: this whole process, app and data included; a peer: its worker process).
Write throughput: turns stored per second over the LoCoMo stores (one call per store,
or per turn where the library keeps an id per call only: mem0). Search latency: the
client's time per search (memchat: over its API; peers: the library call).

    .venv/bin/python bench/peers.py [--systems memchat faiss bm25 llamaindex mem0]
        [--large 10000] [--smoke] [--json FILE] [--markdown FILE] [--plot FILE]
    .venv/bin/python bench/peers.py --from-json FILE [--markdown FILE] [--plot FILE]

`--smoke`: one LoCoMo conversation's first three sessions and the first ten questions
whose evidence they hold; no other data, no large store; every system whose
environment is there (the test suite runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog
from _client import percentile, post, service
from locomo import CATEGORIES, normalise_evidence, normalise_id, sessions_of
from madial import dialogues_of, memory_bank, query_of

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
SMALL_STORE = Path(__file__).parent / "labelled" / "small_store.jsonl"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
PEERS = ("faiss", "bm25", "llamaindex", "mem0")
LOCOMO_KS = (5, 10, 20)
MADIAL_KS = (1, 3, 5, 10)
START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Turn:
    id: str
    text: str
    speaker: str | None
    role: str
    time: dt.datetime
    session: int = 0

    @property
    def peer_text(self) -> str:
        return f"{self.speaker}: {self.text}" if self.speaker else self.text


@dataclass(frozen=True)
class Query:
    user: str
    text: str
    gold: frozenset[str]
    category: str


@dataclass
class Workload:
    name: str
    stores: dict[str, list[Turn]]
    queries: list[Query]
    ks: tuple[int, ...]
    # Results asked for per search (default: the largest k): the small store asks 5, as
    # bench/small_store.py does.
    search_k: int | None = None


def locomo(
    path: Path,
    conversations: int | None = None,
    questions: int | None = None,
    sessions: int | None = None,
) -> Workload:
    """LoCoMo's conversations (the first `conversations`), each its first `sessions`
    sessions, with the first `questions` questions of each whose evidence they hold."""
    items = json.loads(path.read_text(encoding="utf-8"))[:conversations]
    stores: dict[str, list[Turn]] = {}
    queries: list[Query] = []
    for item in items:
        conversation = item["conversation"]
        user = item["sample_id"]
        stores[user] = [
            Turn(
                normalise_id(turn["dia_id"]),
                turn["text"],
                turn["speaker"],
                "user" if turn["speaker"] == conversation["speaker_a"] else "assistant",
                date + dt.timedelta(seconds=position),
                number,
            )
            for number, date, turns in sessions_of(conversation)[:sessions]
            for position, turn in enumerate(turns)
        ]
        held = {turn.id for turn in stores[user]}
        asked = [
            Query(user, qa["question"], evidence, name)
            for qa in item["qa"]
            if (name := CATEGORIES.get(qa["category"]))
            and (evidence := frozenset(normalise_evidence(qa["evidence"])))
            and evidence <= held
        ]
        queries += asked[:questions]
    return Workload("LoCoMo", stores, queries, LOCOMO_KS)


def madial(data: Path, lang: str) -> Workload:
    bank = memory_bank(data, lang)
    stores: dict[str, list[Turn]] = {}
    for memory_id, memory in bank.items():
        stores.setdefault(f"madial-{lang}-{memory['user-id']}", []).append(
            Turn(
                memory_id,
                memory["event"],
                None,
                "user",
                dt.datetime.fromisoformat(memory["time"]).replace(tzinfo=dt.UTC),
            )
        )
    queries = [
        Query(
            f"madial-{lang}-{dialogue['user-id']}",
            query_of(dialogue, "official"),
            frozenset(str(i) for i in dialogue["relevant-id"]),
            "all",
        )
        for dialogue in dialogues_of(data, lang)
    ]
    return Workload(f"MADial {lang}", stores, queries, MADIAL_KS)


def small_store(path: Path) -> Workload:
    stores: dict[str, list[Turn]] = {}
    queries: list[Query] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        user = f"small-{case['id']}"
        stores[user] = [
            Turn(str(i), text, None, role, START + dt.timedelta(minutes=i))
            for i, (role, text) in enumerate(case["turns"])
        ]
        queries.append(Query(user, case["query"], frozenset(str(g) for g in case["gold"]), "all"))
    return Workload("small store", stores, queries, (1, 3), search_k=5)


def large_store(path: Path, size: int) -> tuple[list[Turn], list[str]]:
    """One user's `size` turns (LoCoMo's, cycled, each its own id) and 200 questions."""
    base = locomo(path)
    turns = [t for store in base.stores.values() for t in store]
    cycled = [
        Turn(f"{i}", turns[i % len(turns)].text, turns[i % len(turns)].speaker,
             turns[i % len(turns)].role, START + dt.timedelta(seconds=i), i // 1000)
        for i in range(size)
    ]  # fmt: skip
    return cycled, [q.text for q in base.queries[:200]]


class System(Protocol):
    name: str

    async def add(self, user: str, turns: list[Turn]) -> float: ...
    async def search(self, user: str, query: str, k: int) -> tuple[list[str], float]: ...
    async def resident_mib(self) -> float: ...


class Memchat:
    """The service in process, through its REST API."""

    name = "memchat"

    def __init__(self, client: Any) -> None:
        self._client = client
        self._run = uuid.uuid4().hex[:8]

    def _user(self, user: str) -> str:
        return f"{user}-{self._run}"

    async def add(self, user: str, turns: list[Turn]) -> float:
        started = time.perf_counter()
        sessions: dict[int, list[Turn]] = {}
        for turn in turns:
            sessions.setdefault(turn.session, []).append(turn)
        for number, part in sessions.items():
            session = await post(
                self._client, "/v1/sessions", {"user_id": self._user(user), "title": f"s{number}"}
            )
            for start in range(0, len(part), 1000):
                messages = [
                    {
                        "role": t.role,
                        "name": t.speaker,
                        "content": t.text,
                        "external_id": t.id,
                        "created_at": t.time.isoformat(),
                    }
                    for t in part[start : start + 1000]
                ]
                await post(
                    self._client, f"/v1/sessions/{session['id']}/history", {"messages": messages}
                )
        return time.perf_counter() - started

    async def search(self, user: str, query: str, k: int) -> tuple[list[str], float]:
        started = time.perf_counter()
        body = {"user_id": self._user(user), "query": query, "k": k, "kinds": ["turn"]}
        results = (await post(self._client, "/v1/memory/search", body))["results"]
        return [r["external_id"] for r in results], time.perf_counter() - started

    async def resident_mib(self) -> float:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0


class Peer:
    """A library in `.venv-peers`, run by `bench/peers_worker.py`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._process = subprocess.Popen(
            [str(PEERS_PYTHON), str(Path(__file__).parent / "peers_worker.py"), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"{name} did not start: {ready}")

    def _read(self) -> dict:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} stopped (exit code {self._process.wait()})")
        return json.loads(line)

    def call(self, request: dict) -> dict:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        return self._read()

    async def add(self, user: str, turns: list[Turn]) -> float:
        texts = [{"id": t.id, "text": t.peer_text} for t in turns]
        return float(self.call({"op": "add", "user": user, "turns": texts})["seconds"])

    async def search(self, user: str, query: str, k: int) -> tuple[list[str], float]:
        answer = self.call({"op": "search", "user": user, "query": query, "k": k})
        return answer["ids"], float(answer["seconds"])

    async def resident_mib(self) -> float:
        return float(self.call({"op": "rss"})["mib"])

    def versions(self) -> dict[str, str]:
        return dict(self.call({"op": "versions"})["versions"])

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=60)


@dataclass
class Figures:
    recall: dict[str, dict[int, float]] = field(default_factory=dict)
    write_turns_per_s: float = 0.0
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    large: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)


def latency(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "p50": statistics.median(ms),
        "p95": percentile(ms, 0.95),
        "p99": percentile(ms, 0.99),
    }


async def measure(system: System, workload: Workload, figures: Figures) -> None:
    added = 0.0
    for user, turns in workload.stores.items():
        added += await system.add(user, turns)
    # One search first, untimed: a library's first call loads what it loads lazily.
    await system.search(workload.queries[0].user, workload.queries[0].text, 1)
    if workload.name == "LoCoMo":
        figures.write_turns_per_s = sum(len(t) for t in workload.stores.values()) / added
    by_group: dict[str, dict[int, list[float]]] = {}
    times: list[float] = []
    for query in workload.queries:
        ranked, seconds = await system.search(
            query.user, query.text, workload.search_k or max(workload.ks)
        )
        times.append(seconds)
        for group in ("all", query.category):
            for k in workload.ks:
                share = len(query.gold & set(ranked[:k])) / len(query.gold)
                if workload.name == "small store":
                    share = float(bool(query.gold & set(ranked[:k])))
                by_group.setdefault(group, {}).setdefault(k, []).append(share)
    for group, by_k in by_group.items():
        key = workload.name if group == "all" else f"{workload.name} {group}"
        figures.recall[key] = {k: sum(v) / len(v) for k, v in by_k.items()}
    figures.latency_ms[workload.name] = latency(times)


async def measure_large(system: System, turns: list[Turn], questions: list[str], figures: Figures):
    seconds = 0.0
    for start in range(0, len(turns), 1000):
        seconds += await system.add("large", turns[start : start + 1000])
    times = [(await system.search("large", q, 10))[1] for q in questions]
    figures.large = {
        "turns": len(turns),
        "write_turns_per_s": len(turns) / seconds,
        **{f"search_{k}_ms": v for k, v in latency(times).items()},
        "resident_mib": await system.resident_mib(),
    }


async def run_system(
    name: str, workloads: list[Workload], large: tuple[list[Turn], list[str]] | None
) -> Figures:
    figures = Figures()
    if name == "memchat":
        async with service(None) as client:
            system: System = Memchat(client)
            for workload in workloads:
                await measure(system, workload, figures)
            if large:
                await measure_large(system, *large, figures)
        return figures
    peer = Peer(name)
    try:
        figures.versions = peer.versions()
        for workload in workloads:
            await measure(peer, workload, figures)
        if large:
            await measure_large(peer, *large, figures)
    finally:
        peer.close()
    return figures


def table(results: dict[str, Figures]) -> str:
    """The figures as one Markdown table, a column per system."""
    names = list(results)
    rows: list[tuple[str, list[str]]] = []
    first = next(iter(results.values()))
    for key, by_k in first.recall.items():
        for k in by_k:
            label = f"{key} top-{k}" if key == "small store" else f"{key} R@{k}"
            rows.append((label, [f"{results[n].recall.get(key, {}).get(k, float('nan')):.3f}"
                                 for n in names]))  # fmt: skip
    rows.append(("write, turns/s (LoCoMo stores)",
                 [f"{results[n].write_turns_per_s:.1f}" for n in names]))  # fmt: skip
    for workload in first.latency_ms:
        rows.append((f"search p50 / p95 / p99, ms ({workload})", [
            " / ".join(f"{results[n].latency_ms[workload][p]:.1f}" for p in ("p50", "p95", "p99"))
            for n in names
        ]))  # fmt: skip
    if first.large:
        size = int(first.large["turns"])
        rows.append((f"{size:,} turns of one user: write, turns/s",
                     [f"{results[n].large['write_turns_per_s']:.1f}" for n in names]))  # fmt: skip
        rows.append((f"{size:,} turns: search p50 / p95 / p99, ms", [
            " / ".join(f"{results[n].large[f'search_{p}_ms']:.1f}" for p in ("p50", "p95", "p99"))
            for n in names
        ]))  # fmt: skip
        rows.append((f"{size:,} turns: resident memory, MiB",
                     [f"{results[n].large['resident_mib']:.0f}" for n in names]))  # fmt: skip
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines)


def plot(results: dict[str, Figures], path: Path) -> None:
    """Recall@10 on LoCoMo against search p95 on LoCoMo, one point per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for name, figures in results.items():
        x = figures.latency_ms["LoCoMo"]["p95"]
        y = figures.recall["LoCoMo"][10]
        axes.scatter([x], [y])
        axes.annotate(name, (x, y), textcoords="offset points", xytext=(5, 5))
    axes.set_xscale("log")
    axes.set_xlabel("search p95, ms (LoCoMo, log scale)")
    axes.set_ylabel("LoCoMo recall@10")
    axes.set_title("Recall against search latency, same data and machine")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def installed_peers() -> list[str]:
    return list(PEERS) if PEERS_PYTHON.exists() else []


async def run(args: argparse.Namespace) -> dict[str, Figures]:
    if args.smoke:
        workloads = [locomo(args.locomo, conversations=1, questions=10, sessions=3)]
    else:
        workloads = [
            locomo(args.locomo),
            madial(args.data, "zh"),
            madial(args.data, "en"),
            small_store(SMALL_STORE),
        ]
    systems = args.systems or ["memchat", *installed_peers()]
    missing = [s for s in systems if s != "memchat" and not PEERS_PYTHON.exists()]
    if missing:
        raise SystemExit(f"{', '.join(missing)}: no {PEERS_PYTHON} (`make bench-peers`)")
    large = large_store(args.locomo, args.large) if args.large else None
    results: dict[str, Figures] = {}
    for name in systems:
        started = time.perf_counter()
        results[name] = await run_system(name, workloads, large)
        print(f"{name}: done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", nargs="+", choices=["memchat", *PEERS])
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data directory")
    parser.add_argument("--large", type=int, default=10_000, help="0: no large store")
    parser.add_argument("--smoke", action="store_true", help="a tiny slice (see above)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--plot", type=Path, help="draw recall against latency here (PNG)")
    parser.add_argument(
        "--from-json", type=Path, help="no run: the table and plot of an earlier --json"
    )
    args = parser.parse_args()
    args.locomo = args.data / "locomo10_dev.json"
    # The service's request log would drown the table.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.smoke:
        args.large = 0
    if args.from_json:
        results = {
            name: Figures(
                recall={
                    key: {int(k): v for k, v in by_k.items()} for key, by_k in f["recall"].items()
                },
                **{key: value for key, value in f.items() if key != "recall"},
            )
            for name, f in json.loads(args.from_json.read_text()).items()
        }
    else:
        results = asyncio.run(run(args))
    text = table(results)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps({n: f.__dict__ for n, f in results.items()}, indent=2, default=str)
        )
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
