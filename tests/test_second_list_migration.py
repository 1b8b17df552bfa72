"""An existing store meets the new default: `memchat serve` on a data directory indexed
with the first embedder alone (the default before the multilingual list) serves at once,
gives every turn the second vector in the background, answers searches as before until
a user's turns all hold it, and, killed midway, resumes where it stopped."""

from __future__ import annotations

import re
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.live import serving

pytestmark = pytest.mark.model

FIRST_MODEL = "all-MiniLM-L6-v2#speaker+window8"
SECOND_MODEL = "multilingual-e5-small-q4-fp32"
STATEMENT = "我姐姐住在成都。"
QUESTION = "Where does my sister live?"
VERBS = ["painted", "fixed", "cleaned", "moved", "sold", "bought", "found", "lost", "carried"]
THINGS = ["chair", "bicycle", "lamp", "table", "kettle", "guitar", "window", "bookshelf"]
PLACES = ["garage", "kitchen", "garden", "office", "station", "library", "harbour"]
# Four batches of the backfill (retrieval.search.memory.REPAIR_BATCH_SIZE, 256): the
# process is killed after the first (the background work seen under way), well before
# the last.
NUM_FILLER = 1000


def filler() -> list[str]:
    """Distinct English turns that share no word with the question."""
    return [
        f"On day {n} I {VERBS[n % 9]} the {THINGS[n % 8]} near the {PLACES[n % 7]}."
        for n in range(NUM_FILLER)
    ]


def vectors_per_model(database: Path) -> dict[str, int]:
    with sqlite3.connect(database) as connection:
        rows = connection.execute(
            "SELECT model, count(*), count(DISTINCT message_id) FROM message_embeddings "
            "GROUP BY model"
        ).fetchall()
    assert all(count == distinct for _, count, distinct in rows)
    return {model: count for model, count, _ in rows}


def search(client: httpx.Client, query: str) -> list[str]:
    body = {"user_id": "alice", "query": query, "k": 5, "kinds": ["turn"]}
    response = client.post("/v1/memory/search", json=body)
    assert response.status_code == 200, response.text
    return [hit["external_id"] for hit in response.json()["results"]]


def second_index(client: httpx.Client) -> str:
    return str(client.get("/readyz").json()["checks"]["second_index"])


def test_a_store_of_the_first_list_alone_is_completed_in_the_background(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    database = data_dir / "memchat.db"
    with serving(data_dir, extra_env={"MEMCHAT_SECOND_EMBEDDER__KIND": "none"}) as client:
        assert "second_index" not in client.get("/readyz").json()["checks"]
        session = client.post("/v1/sessions", json={"user_id": "alice"}).json()
        texts = [STATEMENT, *filler()]
        for start in range(0, len(texts), 500):
            messages = [
                {"role": "user", "content": text, "external_id": str(start + n)}
                for n, text in enumerate(texts[start : start + 500])
            ]
            imported = client.post(
                f"/v1/sessions/{session['id']}/history", json={"messages": messages}
            )
            assert imported.status_code == 201, imported.text
        as_before = search(client, QUESTION)
    assert "0" not in as_before  # MiniLM and BM25 do not read the Chinese statement
    assert vectors_per_model(database) == {FIRST_MODEL: len(texts)}

    # The new default on that store: ready at once, completing it in the background.
    with serving(data_dir) as client:
        state = second_index(client)
        deadline = time.monotonic() + 120
        while not (match := re.fullmatch(r"indexing (\d+) of (\d+) turns \(\d+%\)", state)):
            assert time.monotonic() < deadline, state
            assert not state.startswith("complete"), "completed before it could be stopped"
            time.sleep(0.2)
            state = second_index(client)
        while int(match.group(1)) == 0:
            time.sleep(0.2)
            match = re.fullmatch(r"indexing (\d+) of (\d+) turns \(\d+%\)", second_index(client))
            assert match, "completed before it could be stopped"
        # Searches meanwhile: the user's turns do not all hold the second vector yet,
        # so the first list and BM25 answer, exactly as before.
        assert search(client, QUESTION) == as_before
        client.process.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
        client.process.wait()  # type: ignore[attr-defined]
    stopped_at = vectors_per_model(database)[SECOND_MODEL]
    assert 0 < stopped_at < len(texts)

    with serving(data_dir) as client:
        process = client.process  # type: ignore[attr-defined]
        deadline = time.monotonic() + 300
        while not second_index(client).startswith("complete"):
            assert time.monotonic() < deadline, second_index(client)
            time.sleep(0.5)
        assert second_index(client) == f"complete ({len(texts)} turns)"
        # Now the second list answers too: the statement in Chinese comes first.
        assert search(client, QUESTION)[0] == "0"
        assert search(client, "我姐姐住在哪里？")[0] == "0"
    output = process.stdout.read()
    lines = [line for line in output.splitlines() if "second_vectors_backfilled" in line]
    embedded = [int(re.findall(r"num_turns\W+(\d+)", line)[0]) for line in lines]
    assert embedded == [len(texts) - stopped_at]  # only what was missing, once
    assert vectors_per_model(database) == {FIRST_MODEL: len(texts), SECOND_MODEL: len(texts)}
