"""Hybrid turn memory (FAISS + BM25) over real SQLite and PostgreSQL: exact rankings,
indexed-text recipes, rebuilds from SQL, near-duplicates and the recent window."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import DenseTextSettings, LexicalTextSettings, RetrievalSettings, Settings
from retrieval.errors import EmbeddingModelMismatchError
from retrieval.indexes.faiss import FaissIndex
from retrieval.protocols import Embedder, VocabularyEmbedder
from retrieval.search.expansion import NeighbourConfig
from retrieval.search.indexed_text import TextRecipe
from retrieval.search.lexical import Feedback, word_terms
from retrieval.search.memory import RetrievalConfig, TurnMemory
from storage.db import Database, create_engine
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn
from storage.repositories import Repositories
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_memory import import_history, search
from tests.test_api_sessions import create_session

# The service's own configuration (the settings' defaults).
HYBRID = RetrievalConfig()
CONTEXTUAL = TextRecipe(speaker=True, date=True, caption=True, previous=1)
# Tests of one mechanism switch the others off, by name: the raw turn as text, no
# pseudo-relevance feedback, no related-word expansion, context terms at full weight.
RAW = TextRecipe()
BARE = replace(
    HYBRID,
    dense_text=RAW,
    lexical_text=RAW,
    feedback=Feedback(num_docs=0),
    neighbours=NeighbourConfig(num_neighbours=0),
    context_weight=1.0,
)


@pytest.fixture
async def repos(database_url: str) -> AsyncIterator[Repositories]:
    engine = create_engine(database_url)
    yield Repositories.of(Database(engine))
    await engine.dispose()


def memory_for(
    repos: Repositories, directory: Path, config: RetrievalConfig = HYBRID
) -> TurnMemory:
    embedder = HashEmbedder()
    return TurnMemory(
        repos.messages,
        repos.embeddings,
        embedder,
        FaissIndex(directory, embedder.dimension),
        config,
    )


async def add_turns(
    repos: Repositories, memory: TurnMemory, turns: list[tuple[str, str]]
) -> list[int]:
    chat, _user = await repos.sessions.create_session(
        "alice", None, {}, tenant_id=DEFAULT_TENANT_ID
    )
    result = await repos.messages.append(
        chat,
        [NewTurn(role="user", name=name, content=text, token_count=1) for name, text in turns],
    )
    await memory.index(result.turns)
    return [m.id for m in result.turns]


async def ranked(memory: TurnMemory, user_pk: int, query: str, k: int = 10) -> list[int]:
    vector = (await memory.embed([query]))[0]
    return [hit.id for hit in await memory.search(user_pk, vector, k, query=query)]


async def user_pk_of(repos: Repositories) -> int:
    return (await repos.users.get_user("alice", tenant_id=DEFAULT_TENANT_ID)).id


async def test_lexical_index_is_rebuilt_from_sql_and_follows_deletes(
    repos: Repositories, tmp_path: Path
) -> None:
    lexical = replace(BARE, mode="lexical", duplicate_threshold=2.0)
    memory = memory_for(repos, tmp_path / "i", lexical)
    first = await add_turns(repos, memory, [("A", "我对花生过敏"), ("B", "今天天气很好")])
    second = await add_turns(repos, memory, [("A", "花生酱很好吃"), ("B", "red car")])
    user_pk = await user_pk_of(repos)
    assert await ranked(memory, user_pk, "花生") == [first[0], second[0]]
    # A new process has no lexical state: it is built from SQL on first use.
    fresh = memory_for(repos, tmp_path / "i", lexical)
    assert await ranked(fresh, user_pk, "花生") == [first[0], second[0]]
    assert await ranked(fresh, user_pk, "天气") == [first[1]]
    session_id = (await repos.sessions.list_sessions("alice", tenant_id=DEFAULT_TENANT_ID))[0][0].id
    await fresh.forget(user_pk, (await repos.sessions.delete_session(session_id)).message_ids)
    assert await ranked(fresh, user_pk, "花生") == [second[0]]
    assert await ranked(fresh, user_pk, "天气") == []


@pytest.mark.parametrize("fusion", ["rrf", "zscore"])
async def test_hybrid_fuses_dense_and_lexical_and_drops_duplicates(
    repos: Repositories, tmp_path: Path, fusion: str
) -> None:
    memory = memory_for(repos, tmp_path / "h", replace(HYBRID, fusion=fusion))
    ids = await add_turns(
        repos,
        memory,
        [
            ("A", "I am allergic to peanuts"),
            ("A", "I am allergic to peanuts"),  # said twice: one copy is enough
            ("B", "peanuts are legumes, not nuts"),
            ("A", "my sister lives in Berlin"),
        ],
    )
    user_pk = await user_pk_of(repos)
    # The second copy leads: its lexical text also carries the turn before it (the
    # first copy) as context. One copy is kept.
    assert await ranked(memory, user_pk, "peanut allergy") == [ids[1], ids[2], ids[3]]
    assert await ranked(memory, user_pk, "peanut allergy", k=1) == [ids[1]]
    # Without dedup both copies come back.
    plain = memory_for(repos, tmp_path / "h2", replace(HYBRID, duplicate_threshold=2.0))
    assert await ranked(plain, user_pk, "peanut allergy", k=3) == [ids[1], ids[2], ids[0]]


async def test_contextual_text_finds_a_turn_by_its_neighbour_and_caption(
    repos: Repositories, tmp_path: Path
) -> None:
    config = replace(BARE, mode="lexical", lexical_text=CONTEXTUAL, duplicate_threshold=2.0)
    memory = memory_for(repos, tmp_path / "c", config)
    chat, _user = await repos.sessions.create_session(
        "alice", None, {}, tenant_id=DEFAULT_TENANT_ID
    )
    result = await repos.messages.append(
        chat,
        [
            NewTurn(role="user", name="Mel", content="Did you adopt the puppy?", token_count=1),
            NewTurn(
                role="assistant",
                name="Caroline",
                content="Yes! Take a look at this",
                token_count=1,
                image_caption="a golden retriever on a beach",
            ),
        ],
    )
    ids = [m.id for m in result.turns]
    await memory.index(result.turns)
    user_pk = await user_pk_of(repos)
    assert await ranked(memory, user_pk, "golden retriever") == [ids[1]]
    # The second turn carries the first as context; the first is shorter, so it leads.
    assert await ranked(memory, user_pk, "puppy") == [ids[0], ids[1]]
    assert await ranked(memory, user_pk, "Caroline") == [ids[1]]
    # A turn indexed alone reads its predecessor from SQL: "look" is only in that one,
    # and the new turn's shorter text ranks first.
    later = await repos.messages.append(
        chat, [NewTurn(role="user", name="Mel", content="So cute", token_count=1)]
    )
    await memory.index(later.turns)
    assert await ranked(memory, user_pk, "look") == [later.turns[0].id, ids[1]]


@pytest.mark.model
async def test_related_words_of_the_real_embedder_find_a_turn_without_the_asked_word(
    repos: Repositories, tmp_path: Path, real_embedder: Embedder
) -> None:
    turns = [
        ("Mel", "I practise the violin every evening"),
        ("Mel", "We went hiking on Sunday"),
        ("Mel", "Pasta for dinner again"),
    ]
    words_only = replace(BARE, mode="lexical", duplicate_threshold=2.0)
    plain = TurnMemory(
        repos.messages, repos.embeddings, real_embedder, FaissIndex(tmp_path / "p", 384), words_only
    )
    ids = await add_turns(repos, plain, turns)
    user_pk = await user_pk_of(repos)
    assert await ranked(plain, user_pk, "Which instrument does she play?") == []
    related = replace(words_only, neighbours=NeighbourConfig(3, 0.5, 0.3))
    expanded = TurnMemory(
        repos.messages, repos.embeddings, real_embedder, FaissIndex(tmp_path / "e", 384), related
    )
    assert await ranked(expanded, user_pk, "Which instrument does she play?") == [ids[0]]


class TextsEmbedded:
    """An embedder that notes every text it is given, and reads whole words from the real
    embedder's vocabulary table where `vocabulary` is on."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.texts: list[str] = []

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += texts
        return await self.inner.embed(texts)


class VocabularyTextsEmbedded(TextsEmbedded):
    def vocabulary_vectors(self, words: Sequence[str]) -> dict[str, np.ndarray]:
        assert isinstance(self.inner, VocabularyEmbedder)
        return self.inner.vocabulary_vectors(words)


@pytest.mark.parametrize("table", [False, True])
async def test_words_of_the_vocabulary_are_read_from_its_table_not_embedded(
    repos: Repositories, tmp_path: Path, real_embedder: Embedder, table: bool
) -> None:
    turns = [
        ("Mel", "I practise the violin every evening"),
        ("Mel", "We went hiking on Sunday"),
        ("Mel", "Pasta for dinner again"),
    ]
    embedder = (VocabularyTextsEmbedded if table else TextsEmbedded)(real_embedder)
    config = replace(
        BARE, mode="lexical", duplicate_threshold=2.0, neighbours=NeighbourConfig(3, 0.5, 0.3)
    )
    memory = TurnMemory(
        repos.messages, repos.embeddings, embedder, FaissIndex(tmp_path, 384), config
    )
    ids = await add_turns(repos, memory, turns)
    user_pk = await user_pk_of(repos)
    indexed = list(embedder.texts)
    question = "Which instrument does she play nowadayz?"
    vector = await memory.embed_query(user_pk, question)
    hits = await memory.search(user_pk, vector, 10, query=question)
    # The same related words either way: "instrument" finds "violin".
    assert [hit.id for hit in hits] == [ids[0]]
    said = [word for _name, text in turns for word in word_terms(text)]
    asked = list(word_terms(question))
    assert "violin" in said and asked == ["instrument", "play", "nowadayz"]
    embedded_words = [text for text in embedder.texts if text in said + asked]
    if table:
        # Only the words that the vocabulary splits into pieces are embedded: one said,
        # one asked.
        assert embedded_words == ["practise", "nowadayz"]
    else:
        assert sorted(embedded_words) == sorted(said + asked)
    # The turns' texts are embedded either way.
    assert [text for text in indexed if text not in said] == [
        "I practise the violin every evening",
        "We went hiking on Sunday",
        "Pasta for dinner again",
    ]


async def test_a_windowed_turn_vector_is_the_mean_of_its_windows(
    repos: Repositories, tmp_path: Path
) -> None:
    recipe = TextRecipe(speaker=True, window=4)
    memory = memory_for(repos, tmp_path / "w", replace(BARE, mode="dense", dense_text=recipe))
    [turn_id] = await add_turns(repos, memory, [("Mel", "we adopted a puppy named Rex")])
    assert memory.vector_model == "hash-64#speaker+window4"
    [stored] = await repos.embeddings.list_user_vectors(
        await user_pk_of(repos), memory.vector_model, {turn_id}
    )
    windows = HashEmbedder().embed_now(["Mel: we adopted a puppy", "Mel: named Rex"])
    mean = windows.mean(axis=0)
    vector = np.frombuffer(stored.vector, dtype=np.float32)
    np.testing.assert_allclose(vector, mean / np.linalg.norm(mean), atol=1e-6)
    # The FAISS index holds the same vector: "Rex" alone finds the turn at its cosine.
    query = HashEmbedder().embed_now(["Mel: named Rex"])[0]
    [hit] = await memory.search(await user_pk_of(repos), query, 1)
    assert (hit.id, hit.score) == (turn_id, pytest.approx(float(vector @ query), abs=1e-6))


async def test_a_changed_turn_text_is_treated_like_a_model_change(
    repos: Repositories, tmp_path: Path
) -> None:
    raw = memory_for(repos, tmp_path / "m", replace(BARE, mode="dense"))
    ids = await add_turns(repos, raw, [("A", "green boat"), ("B", "red car")])
    assert await repos.embeddings.list_embedding_models() == [("hash-64", 64)]
    contextual = memory_for(
        repos, tmp_path / "m", replace(BARE, mode="dense", dense_text=CONTEXTUAL)
    )
    assert contextual.vector_model == "hash-64#speaker+date+caption+previous1"
    with pytest.raises(EmbeddingModelMismatchError, match="memchat reindex"):
        await contextual.check_model()
    assert await contextual.reindex_all() == 2
    await contextual.check_model()
    assert await repos.embeddings.list_embedding_models() == [
        ("hash-64#speaker+date+caption+previous1", 64)
    ]
    assert await ranked(contextual, await user_pk_of(repos), "red car", k=1) == [ids[1]]


def hybrid_settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        retrieval=RetrievalSettings(
            mode="hybrid",
            dense_text=DenseTextSettings(
                speaker=True, date=True, caption=True, previous=1, window=0
            ),
            lexical_text=LexicalTextSettings(speaker=True, date=True, caption=True, previous=1),
            duplicate_threshold=0.9,
        ),
    )


@pytest.fixture
async def hybrid_client(tmp_path: Path, database_url: str) -> AsyncIterator[AsyncTestClient]:
    app = create_app(
        hybrid_settings(tmp_path, database_url),
        embedder=HashEmbedder(),
        engine=ScriptedEngine(["Noted."]),
    )
    async with local_client(app) as client:
        yield client


CHINESE_HISTORY = [
    {"role": "user", "content": "我对花生过敏", "external_id": "z1"},
    {"role": "assistant", "content": "好的，我记住了", "external_id": "z2"},
    {"role": "user", "content": "我妹妹住在上海", "external_id": "z3"},
    {"role": "user", "content": "Take a look!", "external_id": "z4", "image_caption": "a red kite"},
]


async def test_chinese_turns_are_found_by_chinese_queries_over_http(
    hybrid_client: AsyncTestClient,
) -> None:
    session = await create_session(hybrid_client)
    await import_history(hybrid_client, session["id"], CHINESE_HISTORY)
    found = await search(hybrid_client, "花生", k=1, kinds=["turn"])
    assert [(r["external_id"], r["text"]) for r in found] == [("z1", "我对花生过敏")]
    found = await search(hybrid_client, "我妹妹住在哪里？", k=1)
    assert [r["external_id"] for r in found] == ["z3"]
    # The caption is indexed but results carry the raw turn, with its time.
    found = await search(hybrid_client, "kite", k=1)
    assert [(r["external_id"], r["text"]) for r in found] == [("z4", "Take a look!")]
    assert found[0]["created_at"]


async def test_recent_window_is_excluded_from_hybrid_retrieval(
    hybrid_client: AsyncTestClient,
) -> None:
    old = await create_session(hybrid_client)
    await import_history(hybrid_client, old["id"], CHINESE_HISTORY[:1])
    session = await create_session(hybrid_client)
    first = (
        await hybrid_client.post(
            f"/v1/sessions/{session['id']}/messages", json={"content": "花生 花生"}
        )
    ).json()
    turn = (
        await hybrid_client.post(
            f"/v1/sessions/{session['id']}/messages", json={"content": "花生怎么样"}
        )
    ).json()
    recent = turn["context"]["recent_message_ids"]
    assert len(recent) == 2
    # Only the old session's turn comes back, once: the window's own 花生 turn never, and
    # the old turn not again while the first turn's context (which shows it) is in view.
    assert [m["text"] for m in first["context"]["memories"]] == ["我对花生过敏"]
    assert turn["context"]["memories"] == []


async def test_a_chinese_query_weighs_an_english_only_embedder_by_its_own_weight(
    repos: Repositories, tmp_path: Path, real_embedder: Embedder
) -> None:
    """all-MiniLM-L6-v2 reads no Chinese: it finds the snack question nearer to a question
    about allergies than the allergy itself. With the service's defaults a mostly Chinese
    query gives its similarities no weight (dense_weight_cjk 0), and BM25 decides."""
    turns = [("user", "我对花生过敏。"), ("user", "今晚吃点什么零食好？")]
    default = replace(BARE, duplicate_threshold=2.0)
    assert default.dense_weight_cjk == HYBRID.dense_weight_cjk == 0.0

    def memory(config: RetrievalConfig, name: str) -> TurnMemory:
        index = FaissIndex(tmp_path / name, 384)
        return TurnMemory(repos.messages, repos.embeddings, real_embedder, index, config)

    first = memory(default, "a")
    allergy, snack = await add_turns(repos, first, turns)
    user_pk = await user_pk_of(repos)
    assert await ranked(first, user_pk, "我有什么过敏的食物吗？") == [allergy, snack]
    # Weighed as an English query's would be (here twice BM25's), the similarities win.
    weighed = memory(replace(default, dense_weight_cjk=2.0), "b")
    assert await ranked(weighed, user_pk, "我有什么过敏的食物吗？") == [snack, allergy]
