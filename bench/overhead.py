"""Memory overhead of one chat turn without generation, by the size of a user's store;
what key-fact extraction costs, off the reply's path.

Stores 1k, then 10k (then any further `--sizes`) turns for one user (LoCoMo dialogue
turns, cycled across sessions, imported in process in batches of 1,000 messages, one
batch per session) on the real default stack (all-MiniLM-L6-v2 and multilingual-e5-small,
or `--second none` MiniLM alone; FAISS, SQLite, SmolLM2's tokenizer), then times
`preview_context` (embed the new message, search the user's past turns, load the recent
window and the retrieved rows, assemble the prompt)
for LoCoMo questions, as the next turn of a session, both of a steady turn and of one
that compacts the window (one in ten; see `measure`), and reports the mix a user's turns
are. Prints, per size: the import rate, p50/p95 of the whole, of the
query's embedding and of everything but the embedding (search, SQL reads, window,
assembly), the search alone, the agreement of the turn search with exact search (the
share of exact search's top 10 that the service's search returns, over the same
questions; the exact index is a flat FAISS copy of the same vectors), and the process's
resident memory. After the largest size, the service is restarted on the same data and
the user's first preview is timed (the indexes opened from their files and SQL).

Then the cost of fact extraction: per message in the background worker, and the latency
of real chat turns (CPU engine, short replies, back to back) with extraction on and off.
Then the cost of knowledge retrieval per turn: the same measurement with no documents
in the knowledge base, and again after ingesting `--documents` LoCoMo sessions as
Markdown documents (half shared, half the user's own) into embedded Chroma.
A benchmark: nothing here is asserted. `--json FILE` writes the per-size figures, and
`--plot FILE` draws them (PNG; matplotlib, the `bench` extra).

    .venv/bin/python bench/overhead.py [--queries 200] [--sizes 1000 10000 100000]
        [--documents 107] [--chat-turns 30] [--json FILE] [--plot FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

from _server import MODELS_CACHE

from app.runtime import Runtime, build_runtime, close_runtime, retrieval_config
from app.settings import (
    EmbedderSettings,
    EngineSettings,
    FactSettings,
    SecondEmbedderSettings,
    Settings,
)
from retrieval.chat.timing import StageClock
from retrieval.dense import SecondDense
from retrieval.facts.rules import rule_extractor
from retrieval.indexes.faiss import FaissIndex
from retrieval.knowledge.base import Upload
from retrieval.protocols import SamplingParams, ScoredId
from retrieval.search.memory import TurnMemory
from storage import migrate
from storage.db import create_engine
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo10_dev.json"
# One import call per session: batches of 1,000 messages, the API's largest.
TURNS_PER_SESSION = 1000
# A turn after a large import evaluates a full 8k-token prompt on the CPU: on two busy
# cores that may take longer than the service's default limit for one turn.
ENGINE = EngineSettings(timeout_s=600)


def load_locomo(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(speaker, text) of every dialogue turn, and every question, from the LoCoMo file."""
    conversations = json.loads(path.read_text(encoding="utf-8"))
    turns: list[tuple[str, str]] = []
    questions: list[str] = []
    for item in conversations:
        conversation = item["conversation"]
        number = 1
        while f"session_{number}" in conversation:
            turns.extend((t["speaker"], t["text"]) for t in conversation[f"session_{number}"])
            number += 1
        questions.extend(qa["question"] for qa in item["qa"])
    return turns, questions


def load_documents(path: Path) -> list[tuple[str, str]]:
    """(title, Markdown text) of every LoCoMo session: one document per session."""
    documents = []
    for number, item in enumerate(json.loads(path.read_text(encoding="utf-8")), start=1):
        conversation = item["conversation"]
        session = 1
        while f"session_{session}" in conversation:
            lines = [f"# Conversation {number}, session {session}", ""]
            lines += [f"{t['speaker']}: {t['text']}\n" for t in conversation[f"session_{session}"]]
            documents.append((f"Conversation {number}.{session}", "\n".join(lines)))
            session += 1
    return documents


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def summary(name: str, values_s: list[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return (
        f"  {name:<30} p50 {statistics.median(ms):7.2f} ms   p95 {percentile(ms, 0.95):7.2f} ms"
        f"   mean {statistics.fmean(ms):7.2f} ms"
    )


async def fill(
    runtime: Runtime, user_id: str, turns: list[tuple[str, str]], start: int, stop: int
) -> str:
    """Store turns[start:stop], cycled, in sessions of TURNS_PER_SESSION; returns the last one."""
    session_id = ""
    for offset in range(start, stop, TURNS_PER_SESSION):
        chat, _user = await runtime.sessions.create(
            user_id, f"bench {offset}", {}, tenant_id=DEFAULT_TENANT_ID
        )
        session_id = chat.id
        batch = []
        for position in range(offset, min(stop, offset + TURNS_PER_SESSION)):
            speaker, text = turns[position % len(turns)]
            role = "user" if position % 2 == 0 else "assistant"
            batch.append(NewTurn(role=role, content=text, name=speaker))
        await runtime.history.run(session_id, batch, tenant_id=DEFAULT_TENANT_ID)
    return session_id


def resident_mib() -> float:
    """This process's resident memory now (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stats(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {"p50": statistics.median(ms), "p95": percentile(ms, 0.95), "mean": statistics.fmean(ms)}


async def timed_previews(
    runtime: Runtime, session_id: str, questions: list[str], warm_up: list[str]
) -> dict[str, list[float]]:
    """Seconds of each preview, whole and by stage, after untimed ones of other texts (a
    text asked again would find its query vectors kept from the first time)."""
    params = SamplingParams(max_tokens=256)
    for question in warm_up:
        await runtime.previews.preview(session_id, question, params, tenant_id=DEFAULT_TENANT_ID)
    times: dict[str, list[float]] = {
        key: [] for key in ("whole", "embed", "rest", "read", "turn_search", "assemble")
    }
    for question in questions:
        clock = StageClock()
        t0 = time.perf_counter()
        await runtime.previews.preview(
            session_id, question, params, tenant_id=DEFAULT_TENANT_ID, clock=clock
        )
        whole = time.perf_counter() - t0
        times["whole"].append(whole)
        times["embed"].append(clock.seconds("embed"))
        times["rest"].append(whole - clock.seconds("embed"))
        times["turn_search"].append(clock.seconds("search"))
        times["assemble"].append(clock.seconds("context") - clock.seconds("search"))
        times["read"].append(times["rest"][-1] - clock.seconds("context"))
    return times


async def measure(
    runtime: Runtime, session_id: str, questions: list[str], num_queries: int
) -> dict[str, dict[str, float]]:
    """Previews of the session's next turn, of both kinds a session has: with the default
    window (at most 100 messages, 20 leaving at a time), one turn in ten finds the window
    over 100 messages and compacts it (the extractive summary grows, the system message
    changes), the nine others do not. The first real turn after a large import compacts
    it to its last 100 messages and adds two: previews then are of a compacting turn;
    after one more real turn (down to 82, plus two), of a steady one. A user's turns are
    the mix, nine steady to one compacting.

    Every preview (and turn) is of a text not asked before in the process: a user's new
    message is new, and a text asked again finds its query vectors kept (the second
    list's embedding, most of a turn's, would not be timed)."""
    distinct = list(dict.fromkeys(questions))
    if len(distinct) < 2 * num_queries + 22:
        raise SystemExit(f"--queries {num_queries}: {len(distinct)} distinct questions held")
    asked, steady_asked = distinct[:num_queries], distinct[num_queries : 2 * num_queries]
    warm_up, turns = distinct[-20:], distinct[-22:-20]
    user = (await runtime.repositories.sessions.get_session(session_id))[1]
    one_token = SamplingParams(max_tokens=1)
    await runtime.turns.complete(session_id, turns[0], one_token, tenant_id=DEFAULT_TENANT_ID)
    compacting = await timed_previews(runtime, session_id, asked, warm_up[:10])
    await runtime.turns.complete(session_id, turns[1], one_token, tenant_id=DEFAULT_TENANT_ID)
    steady = await timed_previews(runtime, session_id, steady_asked, warm_up[10:])
    mixed = {key: steady[key] * 9 + compacting[key] for key in steady}
    search, pinned = [], []
    for question in asked:
        # The search and the pinned facts again, alone, for the breakdown: the query's
        # vectors made first (both lists', as a turn's embedding stage makes them).
        vector = await runtime.memory.embed_query(user.id, question)
        t1 = time.perf_counter()
        await runtime.memory.search(user.id, vector, 5, query=question)
        t2 = time.perf_counter()
        await runtime.facts.pinned(user.id)
        search.append(t2 - t1)
        pinned.append(time.perf_counter() - t2)
    print(summary("turns (9 steady : 1 compacting)", mixed["whole"]))
    print(summary("  embed (1 query)", mixed["embed"]))
    print(summary("  all but the embedding", mixed["rest"]))
    print(summary("steady turn, all but embedding", steady["rest"]))
    print(summary("    session and window read", steady["read"]))
    print(summary("    search, turn rows read", steady["turn_search"]))
    print(summary("    assembly (facts, budget)", steady["assemble"]))
    print(summary("compacting turn, all but emb.", compacting["rest"]))
    print(summary("    assembly and compaction", compacting["assemble"]))
    print(summary("  search alone (k=5)", search))
    print(summary("  pinned facts read alone", pinned))
    figures = {
        "whole": stats(mixed["whole"]),
        "embed": stats(mixed["embed"]),
        "rest": stats(mixed["rest"]),
        "rest_steady": stats(steady["rest"]),
        "rest_compacting": stats(compacting["rest"]),
        "search": stats(search),
        "read": stats(steady["read"]),
        "turn_search": stats(steady["turn_search"]),
        "assemble": stats(steady["assemble"]),
        "assemble_compacting": stats(compacting["assemble"]),
    }
    if runtime.knowledge is not None:
        # Vectors first: timed right after an embedding, a search also pays for the ONNX
        # Runtime threads still spinning on the two cores.
        vectors = await runtime.memory.embed(asked)
        queries = [
            await runtime.memory.dense_query(text, vector)
            for text, vector in zip(asked, vectors, strict=True)
        ]
        knowledge = []
        for query in queries:
            t0 = time.perf_counter()
            await runtime.knowledge.search(user.tenant_id, user.id, query, 3)
            knowledge.append(time.perf_counter() - t0)
        print(summary("  knowledge search (k=3) alone", knowledge))
    return figures


async def texts_of(runtime: Runtime, user_pk: int, hits: list[ScoredId]) -> list[str]:
    turns = await runtime.repositories.messages.list_messages_by_id(user_pk, [h.id for h in hits])
    return [turn.content for turn in turns]


async def agreement(
    runtime: Runtime, settings: Settings, user_pk: int, questions: list[str], directory: Path
) -> float:
    """The share of exact search's top 10 that the service's search also returns: the
    same turn memory (lexical index, fusion) over a flat, exact copy of the vectors.
    Turns are compared by their text: the store repeats each LoCoMo turn, and copies of
    one turn tie, so two searches may return different copies of the same turn."""
    second = None
    if runtime.second_embedder is not None:
        dimension = runtime.second_embedder.dimension
        flat = FaissIndex(directory / "second", dimension, ivf_threshold=2**62)
        second = SecondDense(runtime.second_embedder, flat)
    exact = TurnMemory(
        runtime.repositories.messages,
        runtime.repositories.embeddings,
        runtime.embedder,
        FaissIndex(directory, runtime.embedder.dimension, ivf_threshold=2**62),
        retrieval_config(settings.retrieval, settings.embedder.reads_cjk),
        second=second,
    )
    await exact.ensure_scope(user_pk)
    found = []
    for question in questions:
        vector = (await runtime.memory.embed_queries([question]))[0]
        served = await texts_of(
            runtime, user_pk, await runtime.memory.search(user_pk, vector, 10, query=question)
        )
        truth = await texts_of(
            runtime, user_pk, await exact.search(user_pk, vector, 10, query=question)
        )
        if truth:
            found.append(sum(min(served.count(t), truth.count(t)) for t in set(truth)) / len(truth))
    return statistics.fmean(found)


async def restart_first_preview(settings: Settings, session_id: str, question: str) -> float:
    """A new runtime on the same data: seconds of the user's first preview (its scope
    opened from the index files and SQL)."""
    runtime = await build_runtime(settings)
    try:
        params = SamplingParams(max_tokens=256)
        t0 = time.perf_counter()
        await runtime.previews.preview(session_id, question, params, tenant_id=DEFAULT_TENANT_ID)
        return time.perf_counter() - t0
    finally:
        await close_runtime(runtime)


def plot(sizes: list[dict], path: Path) -> None:
    """p50/p95 of all but the embedding, and of the embedding, against store size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    turns = [item["size"] for item in sizes]
    for key, label, colour in (
        ("rest", "all but the embedding", "C0"),
        ("embed", "query embedding", "C1"),
    ):
        axes.plot(turns, [i[key]["p50"] for i in sizes], "o-", color=colour, label=f"{label}, p50")
        axes.plot(turns, [i[key]["p95"] for i in sizes], "s--", color=colour, label=f"{label}, p95")
    axes.set_xscale("log")
    axes.set_xlabel("stored turns of the user")
    axes.set_ylabel("ms per turn (preview, no generation)")
    axes.set_ylim(bottom=0)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("memchat: memory overhead of a turn by store size")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


async def measure_extraction(turns: list[tuple[str, str]], num_turns: int) -> None:
    """Extraction per message, and chat-turn latency with the extractor on and off."""
    extractor = rule_extractor()
    texts = [text for _speaker, text in turns]
    t0 = time.perf_counter()
    found = sum(len(extractor.extract_now(text)) for text in texts)
    per_message = (time.perf_counter() - t0) / len(texts)
    print(
        f"\nrule extractor: {per_message * 1e6:.0f} us per message, {found} candidate facts "
        f"in {len(texts)} LoCoMo turns"
    )
    # With statements (facts found, pinned and shown) and without (extraction work only).
    runs = [(k, s) for s in (True, False) for k in ("rules", "none", "rules", "none")]
    for kind, with_statements in runs:
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(
                data_dir=Path(tmp),
                models_dir=MODELS_CACHE,
                engine=ENGINE,
                facts=FactSettings(extractor=kind),
            )
            engine = create_engine(settings.resolved_database_url())
            await migrate.upgrade(engine)
            await engine.dispose()
            runtime = await build_runtime(settings)
            try:
                await turn_latency(runtime, kind, texts, num_turns, with_statements)
            finally:
                await close_runtime(runtime)


async def turn_latency(
    runtime: Runtime, kind: str, texts: list[str], num_turns: int, with_statements: bool
) -> None:
    """Back-to-back turns: extraction of one turn (if on) overlaps the next turn."""
    chat, user = await runtime.sessions.create("bench-facts", None, {}, tenant_id=DEFAULT_TENANT_ID)
    params = SamplingParams(max_tokens=8, temperature=0)
    statements = [
        "I'm allergic to peanuts.", "I live in Lisbon.", "My name is Ana.", "I love jazz.",
        "我对花生过敏", "我叫小明，我今年6岁了", "I work as a nurse.", "I hate horror movies.",
    ]  # fmt: skip
    latencies = []
    for i in range(num_turns):
        stating = with_statements and i % 2 == 0
        content = statements[i % len(statements)] if stating else texts[i]
        t0 = time.perf_counter()
        await runtime.turns.complete(chat.id, content, params, tenant_id=DEFAULT_TENANT_ID)
        latencies.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    if runtime.fact_worker is not None:
        await runtime.fact_worker.drain()
    drained = time.perf_counter() - t0
    facts = await runtime.repositories.facts.list_facts(user.id)
    label = "statements" if with_statements else "chat only"
    print(summary(f"turn, {label}, extract {kind:<5}", latencies[2:]))
    print(f"    {len(facts)} active facts; worker drained {drained * 1000:.1f} ms after last reply")


async def ingest(runtime: Runtime, user_id: str, documents: list[tuple[str, str]]) -> None:
    """Even documents shared, odd ones the user's own; reports chunks and time."""
    assert runtime.knowledge is not None
    t0 = time.perf_counter()
    num_chunks = 0
    for position, (title, text) in enumerate(documents):
        owner = user_id if position % 2 else None
        document, _owner, _created = await runtime.knowledge.add(
            Upload(DEFAULT_TENANT_ID, owner, title, text, {}, "md")
        )
        await runtime.knowledge.wait_idle()
        stored = await runtime.repositories.knowledge.get_document(document.id)
        num_chunks += stored[0].num_chunks
    elapsed = time.perf_counter() - t0
    print(
        f"\ningested {len(documents)} documents, {num_chunks} chunks in {elapsed:.1f} s"
        f" ({num_chunks / elapsed:.0f} chunks/s); knowledge retrieval k=3 per turn"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--query-precision",
        choices=["fp32", "int8"],
        help="the second list's queries (MEMCHAT_SECOND_EMBEDDER__QUERY_PRECISION); "
        "default: the settings'",
    )
    parser.add_argument(
        "--query-threads",
        type=int,
        help="both embedders' query graph threads (MEMCHAT_EMBEDDER__QUERY_THREADS and the "
        "second's); default: the settings' (1)",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--chat-turns", type=int, default=30)
    parser.add_argument("--documents", type=int, default=107, help="LoCoMo sessions ingested")
    parser.add_argument("--json", type=Path, help="also write the per-size figures here")
    parser.add_argument("--plot", type=Path, help="draw the per-size figures here (PNG)")
    parser.add_argument(
        "--second",
        choices=["e5", "none"],
        default="e5",
        help="the second dense list (MEMCHAT_SECOND_EMBEDDER__KIND); none: MiniLM alone",
    )
    args = parser.parse_args()
    query_precision = {"query_precision": args.query_precision} if args.query_precision else {}
    threads = {"query_threads": args.query_threads} if args.query_threads else {}
    turns, questions = load_locomo(args.data)
    print(f"LoCoMo: {len(turns)} turns, {len(questions)} questions; {args.queries} timed queries")
    sizes: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            models_dir=MODELS_CACHE,
            engine=ENGINE,
            embedder=EmbedderSettings(**threads),
            second_embedder=SecondEmbedderSettings(kind=args.second, **query_precision, **threads),
        )
        engine = create_engine(settings.resolved_database_url())
        await migrate.upgrade(engine)
        await engine.dispose()
        runtime = await build_runtime(settings)
        try:
            stored = 0
            print(f"resident memory before storing: {resident_mib():.0f} MiB")
            for size in sorted(args.sizes):
                t0 = time.perf_counter()
                session_id = await fill(runtime, "bench-user", turns, stored, size)
                elapsed = time.perf_counter() - t0
                # Steady state before timing turns: the approximate index built (if due),
                # the background fact extraction of the imported turns done.
                await runtime.memory.wait_built()
                if runtime.fact_worker is not None:
                    await runtime.fact_worker.drain()
                rate = (size - stored) / elapsed
                print(
                    f"\n{size} stored turns (imported {size - stored} in {elapsed:.1f} s, "
                    f"{rate:.0f} turns/s)"
                )
                stored = size
                print("(no knowledge documents)")
                figures = await measure(runtime, session_id, questions, args.queries)
                user = (await runtime.repositories.sessions.get_session(session_id))[1]
                share = await agreement(
                    runtime,
                    settings,
                    user.id,
                    questions[: args.queries],
                    Path(tmp) / f"exact-{size}",
                )
                gc.collect()
                rss = resident_mib()
                print(
                    f"  top 10 shared with exact search: {share:.4f}; resident memory {rss:.0f} MiB"
                )
                sizes.append(
                    {
                        "size": size,
                        "import_turns_per_s": rate,
                        "exact_top10_share": share,
                        "rss_mib": rss,
                        **figures,
                    }
                )
            await runtime.memory.save()
        finally:
            await close_runtime(runtime)
        first = await restart_first_preview(settings, session_id, questions[1])
        print(f"\nafter a restart at {stored} turns: the user's first preview took {first:.2f} s")
        if args.documents:
            runtime = await build_runtime(settings)
            try:
                await ingest(runtime, "bench-user", load_documents(args.data)[: args.documents])
                print(f"\n{stored} stored turns, with knowledge")
                await measure(runtime, session_id, questions, args.queries)
            finally:
                await close_runtime(runtime)
    if args.json:
        args.json.write_text(
            json.dumps({"sizes": sizes, "restart_first_preview_s": first}, indent=2)
        )
    if args.plot:
        plot(sizes, args.plot)
    if args.chat_turns:
        await measure_extraction(turns, args.chat_turns)


if __name__ == "__main__":
    asyncio.run(main())
