"""The `memchat` command as a newcomer runs it: migrate, serve (real models), restart, reindex."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from storage import migrate
from tests.live import MEMCHAT, cli_env, serving


def test_migrate_creates_the_database(tmp_path: Path) -> None:
    result = subprocess.run(
        [*MEMCHAT, "migrate"], env=cli_env(tmp_path), capture_output=True, text=True, check=True
    )
    assert f"database at revision {migrate.head_revision()}" in result.stdout
    assert (tmp_path / "memchat.db").exists()


@pytest.mark.model
def test_serve_answers_with_the_real_model_and_keeps_everything_across_restart(
    tmp_path: Path,
) -> None:
    with serving(tmp_path) as client:
        assert client.get("/healthz").json() == {"status": "ok", "checks": {}}
        session = client.post("/v1/sessions", json={"user_id": "zoe"}).json()
        turn = client.post(
            f"/v1/sessions/{session['id']}/messages",
            json={"content": "My favourite colour is teal.", "max_tokens": 12, "temperature": 0},
        )
        assert turn.status_code == 200, turn.text
        reply = turn.json()["reply"]["content"]
        assert reply.strip()
        schema = client.get("/schema/openapi.json").json()
        assert "/v1/sessions/{session_id}/messages" in schema["paths"]

        # Generation runs off the event loop: probes answer while the engine is busy.
        other = client.post("/v1/sessions", json={"user_id": "yan"}).json()
        with ThreadPoolExecutor(max_workers=1) as pool:
            long_turn = pool.submit(
                client.post,
                f"/v1/sessions/{other['id']}/messages",
                json={"content": "Write a long poem about the sea.", "max_tokens": 200},
            )
            time.sleep(1.0)
            assert client.get("/healthz", timeout=5).status_code == 200
            assert not long_turn.done()
            assert long_turn.result().status_code == 200

        # The terminal chat, as a person would type into it.
        chat = subprocess.run(
            [
                *MEMCHAT,
                "chat",
                "--url",
                str(client.base_url),
                "--user-id",
                "zoe",
                "--max-tokens",
                "8",
            ],
            input="What is my favourite colour?\n\n",
            env=cli_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert "(user zoe)" in chat.stdout
        assert "assistant> " in chat.stdout
        assert "2 memories used]" in chat.stdout  # the first session's two turns

    with serving(tmp_path) as client:
        stored = client.get(f"/v1/sessions/{session['id']}/messages").json()["messages"]
        assert [(m["role"], m["content"]) for m in stored] == [
            ("user", "My favourite colour is teal."),
            ("assistant", reply),
        ]
        found = client.post(
            "/v1/memory/search",
            json={
                "user_id": "zoe",
                "query": "what colour do I like",
                "k": 5,
                "session_id": session["id"],
            },
        ).json()["results"]
        # Both turns are found after the restart (which ranks first depends on the reply
        # the model wrote).
        assert sorted(r["id"] for r in found) == sorted(m["id"] for m in stored)

    result = subprocess.run(
        [*MEMCHAT, "reindex"], env=cli_env(tmp_path), capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == (
        "re-embedded and indexed 6 messages and 0 knowledge chunks with all-MiniLM-L6-v2"
        " and multilingual-e5-small-q4-fp32"
    )

    # Vectors another turn text (or embedder) made: `serve` stops with a plain message.
    changed = {**cli_env(tmp_path), "MEMCHAT_RETRIEVAL__DENSE_TEXT__WINDOW": "4"}
    refused = subprocess.run(
        [*MEMCHAT, "serve"], env=changed, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        "memchat serve: stored vectors were made by 'all-MiniLM-L6-v2#speaker+window8' "
        "(dimension 384) but the configured embedders and turn texts give "
        "'all-MiniLM-L6-v2#speaker+window4' (dimension 384) and "
        "'multilingual-e5-small-q4-fp32' (dimension 384); run `memchat reindex` to "
        "re-embed every stored turn, or configure the embedders that made them "
        "(MEMCHAT_EMBEDDER__*, MEMCHAT_SECOND_EMBEDDER__*)"
    )


def test_keys_create_list_revoke_and_serve_refuses_open_address_without_keys(
    tmp_path: Path,
) -> None:
    def memchat(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*MEMCHAT, *args], env=cli_env(tmp_path), capture_output=True, text=True, timeout=120
        )

    refused = memchat("serve", "--host", "0.0.0.0")
    assert refused.returncode == 2
    assert "refusing to serve on '0.0.0.0' without API keys" in refused.stderr

    created = memchat("keys", "create", "--tenant", "acme", "--admin", "--name", "ops")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("mck_") and len(secret) > 40
    assert "created admin key 1 ('ops') of tenant 'acme'" in created.stderr
    listed = memchat("keys", "list").stdout.splitlines()
    assert listed[1].split()[:6] == ["1", "acme", "ops", secret[:12], "yes", "-"]
    assert listed[1].endswith("active")
    revoked = memchat("keys", "revoke", "1")
    assert revoked.stdout.strip() == "revoked key 1 ('ops')"
    assert revoked.stderr.splitlines()[-1].startswith("no active key is left: every request")
    assert "revoked" in memchat("keys", "list").stdout.splitlines()[1]
    missing = memchat("keys", "revoke", "9")
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[-1] == "memchat keys revoke: no key with id 9"
    assert memchat("keys", "create", "--tenant", "no spaces").returncode == 2
