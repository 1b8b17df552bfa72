"""Queries and stored texts reach the embedder by their own doors where it has two.

An e5 model wants `query: ` before a search and `passage: ` before what is stored: the
service must ask a `QueryEmbedder` for query vectors for every search (turns, facts,
knowledge) and for stored-text vectors for turns and facts; any other embedder gets both
through `embed`, as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import FactSettings, Settings
from retrieval.protocols import QueryEmbedder
from retrieval.search.memory import TurnMemory
from storage.repositories import Repositories
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_turn_memory import add_turns, memory_for, repos  # noqa: F401  (fixture)


class TwoDoorEmbedder(HashEmbedder):
    """A hash embedder that notes which texts came in as queries and which as stored."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []
        self.passages: list[str] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.passages += texts
        return self.embed_now(texts)

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.queries += texts
        return self.embed_now(texts)


@pytest.fixture
def two_doors() -> TwoDoorEmbedder:
    return TwoDoorEmbedder()


@pytest.fixture
async def client(
    tmp_path: Path, sqlite_url: str, two_doors: TwoDoorEmbedder
) -> AsyncIterator[AsyncTestClient]:
    # No fact extraction: its background embedding would interleave with the requests'.
    settings = Settings(
        data_dir=tmp_path / "data", database_url=sqlite_url, facts=FactSettings(extractor="none")
    )
    app = create_app(settings, embedder=two_doors, engine=ScriptedEngine(["Noted."]))
    async with local_client(app) as test_client:
        yield test_client


def test_only_the_two_door_embedder_is_a_query_embedder() -> None:
    assert isinstance(TwoDoorEmbedder(), QueryEmbedder)
    assert not isinstance(HashEmbedder(), QueryEmbedder)


async def test_searches_embed_queries_and_stored_texts_apart(
    client: AsyncTestClient, two_doors: TwoDoorEmbedder
) -> None:
    session = (await client.post("/v1/sessions", json={"user_id": "alice"})).json()
    history = [{"role": "user", "content": "I am allergic to peanuts"}]
    imported = await client.post(
        f"/v1/sessions/{session['id']}/history", json={"messages": history}
    )
    assert imported.status_code == 201, imported.text
    fact = await client.post("/v1/users/alice/facts", json={"text": "Lives in Berlin"})
    assert fact.status_code == 201, fact.text
    assert two_doors.queries == []
    # The turn as its recipe renders it, then its words (for related words), the fact.
    assert two_doors.passages == [
        "user: I am allergic to peanuts",
        "allergic",
        "peanuts",
        "Lives in Berlin",
    ]

    search = await client.post(
        "/v1/memory/search",
        json={"user_id": "alice", "query": "peanuts", "kinds": ["turn", "fact", "knowledge"]},
    )
    assert search.status_code == 200, search.text
    assert [hit["text"] for hit in search.json()["results"]][:1] == ["I am allergic to peanuts"]
    preview = await client.post(
        f"/v1/sessions/{session['id']}/context", json={"content": "snacks without peanuts?"}
    )
    assert preview.status_code == 200, preview.text
    turn = await client.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": "what am I allergic to?"}
    )
    assert turn.status_code in (200, 201), turn.text
    assert two_doors.queries == ["peanuts", "snacks without peanuts?", "what am I allergic to?"]
    # The turn's own text is stored as it is indexed (its recipe), never as a query.
    assert "user: what am I allergic to?" in two_doors.passages
    assert "what am I allergic to?" not in two_doors.passages


async def boat_memory(
    stores: Repositories, tmp_path: Path
) -> tuple[HashEmbedder, TurnMemory, int, list[int]]:
    """A turn memory of two turns of one user, over a counting embedder."""
    embedder = HashEmbedder()
    memory = memory_for(stores, tmp_path / "index", embedder)
    user_pk, ids = await add_turns(stores, memory, ["green boat on the lake", "red car"])
    return embedder, memory, user_pk, ids


async def test_an_embedder_without_query_vectors_embeds_a_turn_in_one_call(
    repos,  # noqa: F811  (fixture)
    tmp_path: Path,
) -> None:
    embedder, memory, user_pk, ids = await boat_memory(repos, tmp_path)
    [turn] = await repos.messages.list_messages_by_id(user_pk, {ids[0]})
    calls = embedder.num_calls
    query_vector, own_vector = await memory.embed_turn("green boat", turn, [])
    assert embedder.num_calls == calls + 1
    assert query_vector is not None
    np.testing.assert_array_equal(query_vector, (await memory.embed_queries(["green boat"]))[0])
    np.testing.assert_array_equal(query_vector, embedder.embed_now(["green boat"])[0])
    own = embedder.embed_now(["user: green boat on the lake"])[0]
    np.testing.assert_allclose(own_vector.first, own, atol=1e-6)
    assert own_vector.second is None  # no second list


async def test_a_querys_new_words_are_embedded_with_it_and_its_search_embeds_nothing(
    repos,  # noqa: F811  (fixture)
    tmp_path: Path,
) -> None:
    embedder, memory, user_pk, ids = await boat_memory(repos, tmp_path)
    await memory.ensure_scope(user_pk)
    expected = embedder.embed_now(["green yacht harbour"])[0]
    calls = embedder.num_calls
    # "green" is the user's own word; "yacht" and "harbour" are new to them.
    vector = await memory.embed_query(user_pk, "green yacht harbour")
    found = await memory.search(user_pk, vector, 2, query="green yacht harbour")
    assert embedder.num_calls == calls + 1
    np.testing.assert_array_equal(vector, expected)
    assert [hit.id for hit in found] == [ids[0], ids[1]]
    # A query embedded without its words: its search embeds them itself, and finds the same.
    plain = (await memory.embed_queries(["blue yacht harbour"]))[0]
    before = embedder.num_calls
    again = await memory.search(user_pk, plain, 2, query="blue yacht harbour")
    assert embedder.num_calls == before + 1
    assert len(again) == 2
