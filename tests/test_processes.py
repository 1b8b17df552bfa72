"""Two real API processes (`memchat serve`, the default embedder and engine) on one
PostgreSQL database, each with its own data directory, as behind a load balancer: what
one acknowledges, the other finds at once (search, context preview, chat turn), and
what one deletes, the other never returns."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from tests.live import serving_together

pytestmark = [pytest.mark.postgres, pytest.mark.model]

CAT = "My cat is named Zorbulon and she loves tuna."
DOG = "My dog is called Quintavius and he hates baths."
FILLER = [
    "I went hiking in the Alps last summer.",
    "My favourite dish is mushroom risotto.",
    "I work as a nurse at the city hospital.",
    "I am learning to play the cello.",
    "My sister lives in Montreal.",
    "I prefer trains to planes.",
    "I read a novel by Ursula K. Le Guin last week.",
    "We are planning a trip to Portugal in May.",
    "I started running three times a week.",
    "My car is a small electric hatchback.",
]


def api_processes(
    data_dirs: list[Path], database_url: str, extra_env: dict[str, str] | None = None
) -> AbstractContextManager[list[httpx.Client]]:
    """`memchat serve` on the shared database, started together (two cold starts on 2
    cores: 180 s)."""
    env = {"MEMCHAT_DATABASE_URL": database_url} | (extra_env or {})
    return serving_together(data_dirs, extra_env=env, ready_timeout_s=180)


@pytest.fixture(params=["faiss", "chroma-server"])
def processes(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str
) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """Each process with its own FAISS files, or both on one Chroma server (the turn
    vectors shared, each process's lexical index its own)."""
    env: dict[str, str] = {}
    if request.param == "chroma-server":
        env = {
            "MEMCHAT_INDEX__KIND": "chroma",
            "MEMCHAT_CHROMA_URL": request.getfixturevalue("chroma_server_url"),
            "MEMCHAT_CHROMA_PREFIX": f"processes{uuid.uuid4().hex[:8]}",
        }
    with api_processes([tmp_path / "a", tmp_path / "b"], postgres_url, env) as (first, second):
        yield first, second


def search(client: httpx.Client, query: str) -> list[int]:
    answer = client.post("/v1/memory/search", json={"user_id": "olga", "query": query, "k": 5})
    assert answer.status_code == 200, answer.text
    return [r["id"] for r in answer.json()["results"]]


def import_turns(client: httpx.Client, session_id: str, texts: list[str]) -> list[int]:
    before = client.get(f"/v1/sessions/{session_id}/messages").json()["messages"]
    answer = client.post(
        f"/v1/sessions/{session_id}/history",
        json={"messages": [{"role": "user", "content": t} for t in texts]},
    )
    assert answer.status_code == 201, answer.text
    after = client.get(f"/v1/sessions/{session_id}/messages").json()["messages"]
    return [m["id"] for m in after[len(before) :]]


def test_a_turn_acknowledged_by_one_process_is_found_by_the_other(
    processes: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = processes
    first = a.post("/v1/sessions", json={"user_id": "olga"}).json()["id"]
    ids = import_turns(a, first, [*FILLER, CAT, *FILLER[:5]])
    cat_id = ids[len(FILLER)]
    # B's first use of the user opens the scope from SQL.
    assert search(b, "what is my cat called?")[0] == cat_id

    # B's scope is open now: a turn A acknowledges afterwards must still be found by B.
    (dog_id,) = import_turns(a, first, [DOG])
    assert search(b, "what is my dog called?")[0] == dog_id

    # The context B would send, and B's chat turn, hold it too.
    second = b.post("/v1/sessions", json={"user_id": "olga"}).json()["id"]
    (parrot_id,) = import_turns(a, first, ["My parrot is named Orinoco and he sings opera."])
    preview = b.post(
        f"/v1/sessions/{second}/context", json={"content": "What is my parrot's name?"}
    )
    assert preview.status_code == 200, preview.text
    assert parrot_id in [m["id"] for m in preview.json()["context"]["memories"]]
    assert "Orinoco" in preview.json()["messages"][-1]["content"]
    turn = b.post(
        f"/v1/sessions/{second}/messages",
        json={"content": "What is my parrot's name?", "max_tokens": 8, "temperature": 0},
    )
    assert turn.status_code == 200, turn.text
    assert parrot_id in [m["id"] for m in turn.json()["context"]["memories"]]

    # A fact stated through A is pinned in B's next turn.
    fact = a.post(
        "/v1/users/olga/facts", json={"text": "I am allergic to penicillin.", "pinned": True}
    )
    assert fact.status_code == 201, fact.text
    turn = b.post(
        f"/v1/sessions/{second}/messages",
        json={"content": "Anything I should tell my doctor?", "max_tokens": 8, "temperature": 0},
    )
    assert turn.status_code == 200, turn.text
    pinned = [f["text"] for f in turn.json()["context"]["pinned_facts"]]
    assert "I am allergic to penicillin." in pinned

    # A deletes the first session: B never returns its turns again.
    assert a.delete(f"/v1/sessions/{first}").status_code == 204
    for query in ("what is my dog called?", "what is my cat called?"):
        found = search(b, query)
        assert dog_id not in found and cat_id not in found
        assert not set(found) & set(ids)
