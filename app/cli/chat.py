"""`memchat chat`: an interactive terminal chat against a running memchat server,
streaming replies."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

from app.settings import Settings


def _create_session(client: httpx.Client, user_id: str) -> str:
    response = client.post("/v1/sessions", json={"user_id": user_id, "title": "terminal chat"})
    response.raise_for_status()
    return str(response.json()["id"])


def _stream_reply(
    client: httpx.Client, session_id: str, content: str, max_tokens: int | None
) -> None:
    body: dict[str, object] = {"content": content, "stream": True}
    if max_tokens:
        body["max_tokens"] = max_tokens
    with client.stream("POST", f"/v1/sessions/{session_id}/messages", json=body) as response:
        if response.status_code >= 400:
            response.read()
            print(f"[error {response.status_code}] {response.json().get('detail')}")
            return
        event = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                data = json.loads(line.partition(":")[2])
                if event == "token":
                    print(data["text"], end="", flush=True)
                elif event == "done":
                    used = len(data["context"]["memories"])
                    print(f"\n[{data['usage']['completion_tokens']} tokens, {used} memories used]")
                elif event == "error":
                    print(f"\n[error] {data.get('detail')}")


def run_chat(
    url: str,
    user_id: str,
    session_id: str | None,
    *,
    max_tokens: int | None,
    api_key: str | None = None,
) -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(10.0, read=300.0)
    with httpx.Client(base_url=url, timeout=timeout, headers=headers) as client:
        try:
            session_id = session_id or _create_session(client, user_id)
        except httpx.HTTPError as exc:
            print(f"cannot reach memchat at {url}: {exc}", file=sys.stderr)
            return 1
        print(f"session {session_id} (user {user_id}); an empty line or Ctrl-D quits")
        while True:
            try:
                content = input("you> ").strip()
            except EOFError:
                return 0
            if not content:
                return 0
            print("assistant> ", end="", flush=True)
            _stream_reply(client, session_id, content, max_tokens)


def cmd_chat(settings: Settings, args: argparse.Namespace) -> int:
    url = args.url or f"http://{settings.host}:{settings.port}"
    api_key = os.environ.get("MEMCHAT_API_KEY") or None
    return run_chat(url, args.user_id, args.session_id, max_tokens=args.max_tokens, api_key=api_key)


def add_chat_command(commands: Any) -> None:
    chat = commands.add_parser(
        "chat",
        help="chat in the terminal with a running server (API key from $MEMCHAT_API_KEY)",
    )
    chat.add_argument("--url", default=None, help="server URL (default from MEMCHAT_HOST/PORT)")
    chat.add_argument("--user-id", default="me")
    chat.add_argument("--session-id", default=None, help="continue this session")
    chat.add_argument("--max-tokens", type=int, default=None)
    chat.set_defaults(run=cmd_chat)
