"""The knowledge base over HTTP, on SQLite and PostgreSQL, with embedded Chroma.

JSON, Markdown and PDF documents (English and Chinese), deduplication, scoping between
users and shared knowledge, deletion of rows and vectors, background processing, bad
files, and a vector store that is down.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.runtime import build_chroma_index
from app.settings import KnowledgeSettings, Settings
from tests.clients import local_client
from tests.documents import HANDBOOK_MD, make_pdf
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import free_port
from tests.test_api_errors import assert_problem
from tests.test_api_sessions import create_session

SMALL_CHUNKS = KnowledgeSettings(chunk_tokens=24, overlap_tokens=4)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=database_url, knowledge=SMALL_CHUNKS)


async def add_text(
    client: AsyncTestClient, title: str, text: str, status: int = 201, **extra: Any
) -> dict:
    response = await client.post("/v1/knowledge", json={"title": title, "text": text, **extra})
    assert response.status_code == status, response.text
    return response.json()


async def upload(client: AsyncTestClient, filename: str, data: bytes, **fields: str) -> Any:
    return await client.post("/v1/knowledge", files={"file": (filename, data)}, data=fields)


async def search(client: AsyncTestClient, user_id: str, query: str, k: int = 5) -> list[dict]:
    response = await client.post(
        "/v1/memory/search",
        json={"user_id": user_id, "query": query, "k": k, "kinds": ["knowledge"]},
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


async def wait_until_processed(client: AsyncTestClient, document_id: str) -> dict:
    """The document once it is no longer `processing` (bounded: 400 polls)."""
    for _poll in range(400):
        document = (await client.get(f"/v1/knowledge/{document_id}")).json()
        if document["status"] != "processing":
            return document
        await asyncio.sleep(0.05)
    raise AssertionError(f"document {document_id} still processing")


RETURNS = (
    "Items can be returned within thirty days with the receipt.\n\n"
    "Refunds are paid to the original card within five days."
)


async def test_a_json_document_is_chunked_stored_and_found(client: AsyncTestClient) -> None:
    await create_session(client, "alice")
    document = await add_text(client, "Returns", RETURNS, metadata={"team": "support"})
    assert {k: v for k, v in document.items() if k not in ("id", "created_at", "updated_at")} == {
        "user_id": None,
        "title": "Returns",
        "metadata": {"team": "support"},
        "source": "text",
        "filename": None,
        "content_hash": f"sha256:{hashlib.sha256(RETURNS.encode()).hexdigest()}",
        "status": "ready",
        "failure_reason": None,
        "num_chars": len(RETURNS),
        "num_chunks": 2,
        "num_chunks_indexed": 2,
    }
    assert (await client.get(f"/v1/knowledge/{document['id']}")).json() == document
    assert (await client.get("/v1/knowledge")).json() == {"documents": [document]}
    found = await search(client, "alice", "when are refunds paid to my card", k=2)
    # The second chunk starts with the last 4 tokens of the first (the overlap).
    assert [(r["kind"], r["document_id"], r["title"], r["text"]) for r in found] == [
        ("knowledge", document["id"], "Returns", "the receipt.\n\n" + RETURNS.split("\n\n")[1]),
        ("knowledge", document["id"], "Returns", RETURNS.split("\n\n")[0]),
    ]
    assert found[0]["score"] > found[1]["score"]


async def test_the_same_content_again_is_not_stored_twice(client: AsyncTestClient) -> None:
    first = await add_text(client, "Returns", RETURNS)
    again = await add_text(client, "Returns (copy)", RETURNS + "\n", status=200)
    assert again == first
    # The same text is another document in another scope.
    own = await add_text(client, "Returns", RETURNS, user_id="alice")
    assert own["id"] != first["id"] and own["user_id"] == "alice"
    assert [d["id"] for d in (await client.get("/v1/knowledge")).json()["documents"]] == [
        first["id"]
    ]
    found = await search(client, "alice", "refunds paid card", k=10)
    assert sorted(r["document_id"] for r in found) == sorted([first["id"], own["id"]] * 2)


async def test_users_see_their_own_and_shared_knowledge_only(client: AsyncTestClient) -> None:
    alice = await add_text(client, "Notes", "My locker code is 4417.", user_id="alice")
    bob = await add_text(client, "Notes", "My locker code is 9902.", user_id="bob")
    shared = await add_text(client, "Lockers", "Locker codes are reset every January.")
    await create_session(client, "carol")

    def ids(results: list[dict]) -> list[str]:
        return [r["document_id"] for r in results]

    assert ids(await search(client, "alice", "my locker code")) == [alice["id"], shared["id"]]
    assert ids(await search(client, "bob", "my locker code")) == [bob["id"], shared["id"]]
    assert ids(await search(client, "carol", "my locker code")) == [shared["id"]]
    listed = (await client.get("/v1/knowledge", params={"user_id": "alice"})).json()
    assert [d["id"] for d in listed["documents"]] == [alice["id"]]
    assert (await client.get("/v1/knowledge", params={"user_id": "nobody"})).json() == {
        "documents": []
    }


async def test_delete_removes_rows_and_vectors(client: AsyncTestClient, settings: Settings) -> None:
    keep = await add_text(client, "Keep", "The office opens at nine.", user_id="alice")
    gone = await add_text(client, "Gone", "The office closes at six.", user_id="alice")
    user_pk = 1  # alice, the first user of a fresh database: the index scope of her own
    index = build_chroma_index(settings, HashEmbedder().dimension, "knowledge")
    before = await index.list_ids(user_pk)
    assert len(before) == 2
    response = await client.delete(f"/v1/knowledge/{gone['id']}")
    assert response.status_code == 204
    assert_problem(await client.get(f"/v1/knowledge/{gone['id']}"), 404)
    assert_problem(await client.delete(f"/v1/knowledge/{gone['id']}"), 404)
    assert [r["document_id"] for r in await search(client, "alice", "office closes")] == [
        keep["id"]
    ]
    after = await index.list_ids(user_pk)
    assert len(after) == 1 and after < before


async def test_markdown_upload_keeps_heading_paths(client: AsyncTestClient) -> None:
    response = await upload(client, "handbook.md", HANDBOOK_MD.encode(), user_id="alice")
    assert response.status_code == 201, response.text
    document = response.json()
    assert (document["title"], document["source"], document["filename"]) == (
        "handbook",
        "md",
        "handbook.md",
    )
    found = await search(client, "alice", "laptop memory for a new engineer", k=1)
    assert [(r["heading_path"], r["text"]) for r in found] == [
        (
            "Handbook > Equipment",
            "Every new engineer receives a laptop with 64 GB of memory on the first day.",
        )
    ]
    found = await search(client, "alice", "年假是多少天", k=1)
    assert [(r["heading_path"], r["text"]) for r in found] == [
        ("Handbook > 中文说明", "公司的年假是每年二十五天，需要提前两周申请。")
    ]


async def test_pdf_upload_in_english_and_chinese(client: AsyncTestClient) -> None:
    pdf = make_pdf(
        [
            ["Acme Travel Policy", "Train tickets are booked through the Wayfarer portal."],
            ["年假政策", "公司的年假是每年二十五天。"],
        ]
    )
    response = await upload(client, "Policy.PDF", pdf, title="Travel policy")
    assert response.status_code == 201, response.text
    document = response.json()
    assert (document["source"], document["status"], document["num_chunks"]) == ("pdf", "ready", 2)
    await create_session(client, "alice")
    found = await search(client, "alice", "年假有多少天", k=1)
    assert [(r["title"], r["text"]) for r in found] == [
        ("Travel policy", "portal.\n\n年假政策\n公司的年假是每年二十五天。")
    ]
    found = await search(client, "alice", "how are train tickets booked", k=1)
    assert found[0]["text"] == (
        "Acme Travel Policy\nTrain tickets are booked through the Wayfarer portal."
    )


@pytest.mark.parametrize(
    ("filename", "data", "status", "detail"),
    [
        ("notes.docx", b"PK\x03\x04", 415, "'notes.docx' is not a .txt, .md or .pdf file"),
        ("empty.md", b"", 422, "'empty.md' is empty"),
        ("blank.txt", b" \n\t\n", 422, "'blank.txt' has no text"),
        ("latin1.txt", "café".encode("latin-1"), 422, "'latin1.txt' is not UTF-8 text"),
        ("broken.pdf", b"%PDF-1.7\n1 0 obj <<", 422, "'broken.pdf' is not a readable PDF"),
        ("fake.pdf", b"hello", 422, "'fake.pdf' is not a PDF (no %PDF- header)"),
        ("scan.pdf", make_pdf([[]]), 422, "'scan.pdf' has no extractable text"),
        ("big.txt", b"x " * 1100, 413, "'big.txt' has 2200 bytes; the limit is 2048"),
    ],
)
async def test_bad_files_are_refused_and_nothing_is_stored(
    tmp_path: Path, sqlite_url: str, filename: str, data: bytes, status: int, detail: str
) -> None:
    limits = KnowledgeSettings(max_upload_bytes=2048)
    app = create_app(
        Settings(data_dir=tmp_path, database_url=sqlite_url, knowledge=limits),
        embedder=HashEmbedder(),
        engine=ScriptedEngine(),
    )
    async with local_client(app) as client:
        body = assert_problem(await upload(client, filename, data), status, "file")
        assert body["detail"].startswith(f"file: {detail}")
        assert body["errors"][0]["message"] == body["detail"].removeprefix("file: ")
        assert (await client.get("/v1/knowledge")).json() == {"documents": []}


async def test_bad_bodies_are_refused(client: AsyncTestClient) -> None:
    body = assert_problem(
        await client.post(
            "/v1/knowledge", content=b"title=x", headers={"content-type": "text/plain"}
        ),
        415,
        "body",
    )
    assert body["detail"] == "body: send application/json or multipart/form-data (a file in `file`)"
    assert_problem(await client.post("/v1/knowledge", json={"title": "t", "text": " \u3000"}), 422)
    assert_problem(await client.post("/v1/knowledge", json={"title": "", "text": "x"}), 422)
    assert_problem(await upload(client, "a.txt", b"hello", colour="red"), 422, "colour")
    no_file = await client.post("/v1/knowledge", files={"title": (None, "no file")})
    assert_problem(no_file, 422, "file")
    text_as_file = await client.post("/v1/knowledge", files={"file": (None, "just text")})
    assert_problem(text_as_file, 422, "file")
    assert (await client.get("/v1/knowledge")).json() == {"documents": []}


async def test_large_documents_are_processed_in_the_background(
    tmp_path: Path, sqlite_url: str
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        database_url=sqlite_url,
        knowledge=KnowledgeSettings(
            chunk_tokens=16, overlap_tokens=0, inline_chunks=2, embed_batch_size=3
        ),
    )
    text = "\n\n".join(f"Fact number {n} is that the code word is w{n}x." for n in range(10))
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine())
    async with local_client(app) as client:
        accepted = await add_text(client, "Facts", text, status=202)
        assert (accepted["status"], accepted["num_chunks"], accepted["num_chunks_indexed"]) == (
            "processing",
            10,
            0,
        )
        done = await wait_until_processed(client, accepted["id"])
        assert (done["status"], done["num_chunks"], done["num_chunks_indexed"]) == ("ready", 10, 10)
        await create_session(client, "alice")
        found = await search(client, "alice", "code word w7x", k=1)
        assert found[0]["text"] == "Fact number 7 is that the code word is w7x."


async def test_a_vector_store_that_is_down_is_a_503_and_nothing_is_lost(
    tmp_path: Path, sqlite_url: str
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    app = create_app(
        Settings(data_dir=tmp_path, database_url=sqlite_url, chroma_url=down),
        embedder=HashEmbedder(),
        engine=ScriptedEngine(),
    )
    async with local_client(app) as client:
        for _attempt in range(2):
            response = await client.post("/v1/knowledge", json={"title": "T", "text": "Kept."})
            body = assert_problem(response, 503)
            assert response.headers["retry-after"] == "5"
            assert body["detail"].startswith("the vector store is unavailable")
        [document] = (await client.get("/v1/knowledge")).json()["documents"]
        assert document["status"] == "failed"
        assert document["failure_reason"].startswith("the Chroma vector store failed")
        assert document["num_chars"] == len("Kept.")
