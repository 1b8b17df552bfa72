"""Key facts and knowledge documents found in English, in Chinese and across the two,
through the public API.

`bench/labelled/facts_knowledge.json` is fixed, written before any measurement against
it: twelve facts of one user and twelve documents of a tenant, half in English and half
in Chinese, each asked about once in its own language (`same`) and once in the other
(`cross`). The facts are stored with `POST /v1/users/{id}/facts`, the documents with
`POST /v1/knowledge`; each question is asked with `POST /v1/memory/search` (`kinds`:
`fact` or `knowledge`, k = 5) and, for documents, also through the context preview
(`POST /v1/sessions/{id}/context`): whether the document's text reaches the prompt.
top-1: the asked item is first; top-3: among the first three. The service's settings
(`MEMCHAT_*` variables) are what is measured: `MEMCHAT_SECOND_EMBEDDER__KIND=none` gives
the first model alone.

    .venv/bin/python bench/facts_knowledge.py [--url http://127.0.0.1:8000] [--show-failures]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections import defaultdict
from pathlib import Path

from _client import add_embedder_option, post, service, use_embedder

from retrieval.text import is_mostly_cjk

DATA = Path(__file__).parent / "labelled" / "facts_knowledge.json"


async def store(client, data: dict, user_id: str) -> list[int]:
    """The facts (their ids returned) and the documents, in the user's own scope: a run
    sees only its own."""
    fact_ids = [
        (await post(client, f"/v1/users/{user_id}/facts", {"text": fact["text"]}))["id"]
        for fact in data["facts"]
    ]
    for document in data["documents"]:
        body = {"title": document["title"], "text": document["text"], "user_id": user_id}
        await post(client, "/v1/knowledge", body)
    return fact_ids


async def in_prompt(client, session_id: str, query: str, text: str) -> bool:
    """Whether a message would be sent with `text` (the context preview)."""
    preview = await post(client, f"/v1/sessions/{session_id}/context", {"content": query})
    return text in "\n".join(m["content"] for m in preview["messages"])


def figures(rows: dict[str, list[tuple[bool, bool]]]) -> dict[str, dict]:
    return {
        name: {
            "n": len(values),
            "top1": sum(a for a, _ in values) / len(values),
            "top3": sum(b for _, b in values) / len(values),
        }
        for name, values in sorted(rows.items())
    }


async def run(args: argparse.Namespace) -> dict:
    data = json.loads(args.data.read_text(encoding="utf-8"))
    user_id = f"facts-{uuid.uuid4().hex[:8]}"
    rows: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    failures: list[str] = []
    async with service(args.url) as client:
        session = await post(client, "/v1/sessions", {"user_id": user_id})
        fact_ids = await store(client, data, user_id)
        asked = [("fact", "id", fact_ids[i], item) for i, item in enumerate(data["facts"])]
        asked += [("knowledge", "title", item["title"], item) for item in data["documents"]]
        for kind, key, wanted, item in asked:
            source = "zh" if is_mostly_cjk(item["text"]) else "en"
            for way in ("same", "cross"):
                body = {"user_id": user_id, "query": item[way], "k": 5, "kinds": [kind]}
                results = (await post(client, "/v1/memory/search", body))["results"]
                found = [hit[key] for hit in results]
                outcome = (found[:1] == [wanted], wanted in found[:3])
                for name in (f"{kind} all", f"{kind} {way}", f"{kind} {way} {source} item"):
                    rows[name].append(outcome)
                if not outcome[0]:
                    first = results[0]["text"][:40] if results else None
                    failures.append(f"{kind} {way}: {item[way]!r} -> {first!r}")
                if kind == "knowledge":
                    body_text = item["text"].split("\n\n", 1)[1]
                    shown = await in_prompt(client, session["id"], item[way], body_text)
                    rows[f"knowledge in the prompt {way}"].append((shown, shown))
    print(f"facts and knowledge: {len(data['facts'])} facts, {len(data['documents'])} documents")
    result = figures(rows)
    for name, value in result.items():
        top1, top3 = value["top1"], value["top3"]
        print(f"  {name:<32} n={value['n']:<3} top-1 {top1:.3f}  top-3 {top3:.3f}")
    print(f"top-1 failures: {len(failures)}")
    if args.show_failures:
        for failure in failures:
            print(f"  {failure}")
    return result | {"failures": failures}


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
