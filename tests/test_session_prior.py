"""The session prior: a candidate memory gains `MEMCHAT_RETRIEVAL__SESSION_WEIGHT` x the
best fused score among the candidates of its own session, so that the conversation a
question is about, found by its best turn, lifts its other turns."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

import pytest
from litestar.testing import AsyncTestClient

from app.settings import RetrievalSettings, Settings
from retrieval.protocols import Embedder, ScoredId
from retrieval.search.memory import with_session_prior
from storage.messages import MessageRepository
from tests.test_time_in_query import default_service, import_session


def test_a_hit_gains_its_sessions_best_score() -> None:
    ranked = [ScoredId(1, 2.0), ScoredId(4, 1.45), ScoredId(3, 1.4), ScoredId(2, 1.0)]
    sessions = {1: "trip", 3: "trip", 4: "home", 2: "work"}
    moved = with_session_prior(ranked, sessions, 0.1)
    # 3 gains 0.1 x 2.0 (its session's best, hit 1) and passes 4, which gains 0.145.
    assert [(h.id, round(h.score, 6)) for h in moved] == [
        (1, 2.2),
        (3, 1.6),
        (4, 1.595),
        (2, 1.1),
    ]


def test_a_hit_of_no_known_session_is_its_own_and_ties_keep_their_order() -> None:
    ranked = [ScoredId(7, 1.0), ScoredId(8, 0.95), ScoredId(9, 0.5)]
    # 7 gains its own score (1.0 -> 2.0), as a session of its own; 9 gains 8's.
    moved = with_session_prior(ranked, {9: "a", 8: "a"}, 1.0)
    assert [(h.id, round(h.score, 6)) for h in moved] == [(7, 2.0), (8, 1.9), (9, 1.45)]
    tied = [ScoredId(7, 1.0), ScoredId(8, 1.0)]
    assert [h.id for h in with_session_prior(tied, {}, 0.5)] == [7, 8]
    assert [h.id for h in with_session_prior(tied[::-1], {}, 0.5)] == [8, 7]
    assert with_session_prior(ranked, {8: "a", 9: "a"}, 0.0) == ranked


STORES = {
    "en": (
        [("trip-city", "user", "My trip to Kyoto was the best week of the year."),
         ("trip-food", "user", "I ate a lot of ramen there."),
         ("trip-reply", "assistant", "Sounds delicious!")],
        [("home-food", "user", "I ate ramen at home yesterday."),
         ("home-reply", "assistant", "Nice.")],
        "What did I eat on my trip to Kyoto?",
    ),
    "zh": (
        [("trip-city", "user", "我去京都旅行的那一周是今年最开心的时候。"),
         ("trip-food", "user", "我在那里吃了很多拉面。"),
         ("trip-reply", "assistant", "听起来很好吃！")],
        [("home-food", "user", "我昨天在家吃了拉面。"),
         ("home-reply", "assistant", "不错。")],
        "我去京都旅行时吃了什么？",
    ),
}  # fmt: skip
SESSION_OF = {
    "trip-city": "trip", "trip-food": "trip", "trip-reply": "trip",
    "home-food": "home", "home-reply": "home",
}  # fmt: skip


async def search(client: AsyncTestClient, query: str) -> dict[str, float]:
    """The hits' scores by external id, best first."""
    body = {"user_id": "traveller", "query": query, "k": 5, "kinds": ["turn"]}
    response = await client.post("/v1/memory/search", json=body)
    assert response.status_code == 200, response.text
    return {hit["external_id"]: hit["score"] for hit in response.json()["results"]}


@pytest.mark.model
@pytest.mark.parametrize("language", ["en", "zh"])
async def test_each_memory_gains_its_sessions_best_score(
    settings: Settings, real_embedder: Embedder, real_second_embedder: Embedder, language: str
) -> None:
    """Through the API, on the default embedders: the trip's turns rank first, the
    question's words taking them there; each memory's score with the prior is its score
    without it plus 0.1 x the best of its session's (the sessions read from SQL)."""
    trip, home, question = STORES[language]
    day = dt.datetime(2025, 3, 3, 10, 0, tzinfo=dt.UTC)
    found = {}
    for weight in (0.1, 0.0):
        retrieval = RetrievalSettings(session_weight=weight)
        async with default_service(
            settings, real_embedder, real_second_embedder, retrieval
        ) as client:
            if weight:
                await import_session(client, "traveller", day, trip)
                await import_session(client, "traveller", day + dt.timedelta(days=30), home)
            found[weight] = await search(client, question)
    ranks = ["trip-city", "trip-food", "trip-reply", "home-food", "home-reply"]
    assert list(found[0.1]) == list(found[0.0]) == ranks
    plain = found[0.0]
    best = {"trip": plain["trip-city"], "home": plain["home-food"]}
    expected = {name: plain[name] + 0.1 * best[SESSION_OF[name]] for name in ranks}
    assert found[0.1] == pytest.approx(expected, abs=1e-5)


@pytest.mark.model
async def test_a_search_reads_no_session_from_sql_once_its_scope_is_open(
    settings: Settings,
    real_embedder: Embedder,
    real_second_embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The open scope knows its turns' sessions (from the turns it indexed, or read once
    with its snapshot when a restarted process opens it): the prior's search reads none
    from SQL, and a restarted process ranks and scores as the one that stored them."""
    asked: list[list[int]] = []
    sessions_of = MessageRepository.sessions_of

    async def counted(self: MessageRepository, user_pk: int, ids: Collection[int]) -> dict:
        asked.append(sorted(ids))
        return await sessions_of(self, user_pk, ids)

    monkeypatch.setattr(MessageRepository, "sessions_of", counted)
    trip, home, question = STORES["en"]
    day = dt.datetime(2025, 3, 3, 10, 0, tzinfo=dt.UTC)
    found = []
    for restarted in (False, True):
        retrieval = RetrievalSettings(session_weight=0.1)
        async with default_service(
            settings, real_embedder, real_second_embedder, retrieval
        ) as client:
            if not restarted:
                await import_session(client, "traveller", day, trip)
                await import_session(client, "traveller", day + dt.timedelta(days=30), home)
            found.append(await search(client, question))
    assert asked == []
    assert list(found[0]) == list(found[1]) == [
        "trip-city", "trip-food", "trip-reply", "home-food", "home-reply"
    ]  # fmt: skip
    assert found[1] == pytest.approx(found[0], abs=1e-6)
