"""`memchat chat`: an interactive terminal chat against a running memchat server,
streaming replies.

The screen holds the conversation and each turn's summary line, nothing else: the
command's log level is at least `warning` (`LOG_FLOOR`), so the HTTP client's line per
request (`HTTP Request: POST ...`) stays off it, and whatever goes wrong (no server, an
error answer, a timeout, the connection lost mid-reply) is one line, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

from app.settings import Settings

# The most talkative log level the chat screen takes (`app.cli.main` applies it).
LOG_FLOOR = "warning"
CONNECT_TIMEOUT_S = 10.0
# A reply's tokens can be slow to start on a busy CPU: the prompt is read first.
READ_TIMEOUT_S = 300.0
# What a shell reports for a command ended by Ctrl-C (128 + SIGINT).
INTERRUPTED_STATUS = 130


class ChatRefusedError(Exception):
    """An error answer from the server, as the line the screen shows."""


def one_line(text: str) -> str:
    return " ".join(text.split())


def answer_problem(response: httpx.Response) -> str:
    """The status and the problem details' `detail` (with each offending field), or the
    reason phrase where the body is not problem details (a proxy's error page)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not body.get("detail"):
        return f"[error {response.status_code}] {response.reason_phrase}"
    detail = str(body["detail"])
    fields = [e for e in body.get("errors") or () if isinstance(e, dict)]
    if fields:
        detail += " (" + "; ".join(f"{e.get('field')}: {e.get('message')}" for e in fields) + ")"
    return f"[error {response.status_code}] {one_line(detail)}"


def request_problem(exc: httpx.HTTPError, url: str) -> str:
    """A request that got no answer: which server, and what happened to it."""
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot reach memchat at {url}: no connection within {CONNECT_TIMEOUT_S:g} s"
    if isinstance(exc, httpx.ReadTimeout):
        return f"memchat at {url} sent nothing for {READ_TIMEOUT_S:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot reach memchat at {url}: {one_line(str(exc))}"
    reason = one_line(str(exc)) or type(exc).__name__
    return f"no answer from memchat at {url}: {reason}"


def _create_session(client: httpx.Client, user_id: str) -> str:
    response = client.post("/v1/sessions", json={"user_id": user_id, "title": "terminal chat"})
    if response.is_error:
        raise ChatRefusedError(answer_problem(response))
    return str(response.json()["id"])


def _print_event(event: str, data: dict[str, Any]) -> None:
    if event == "token":
        print(data["text"], end="", flush=True)
    elif event == "done":
        used = len(data["context"]["memories"])
        print(f"\n[{data['usage']['completion_tokens']} tokens, {used} memories used]")
    elif event == "error":
        print(f"\n[error] {one_line(str(data.get('detail')))}")


def _stream_reply(
    client: httpx.Client, session_id: str, content: str, max_tokens: int | None
) -> None:
    body: dict[str, object] = {"content": content, "stream": True}
    if max_tokens:
        body["max_tokens"] = max_tokens
    with client.stream("POST", f"/v1/sessions/{session_id}/messages", json=body) as response:
        if response.is_error:
            response.read()
            print(answer_problem(response))
            return
        event = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                _print_event(event, json.loads(line.partition(":")[2]))


def _converse(client: httpx.Client, url: str, session_id: str, max_tokens: int | None) -> int:
    while True:
        try:
            content = input("you> ").strip()
        except EOFError:
            return 0
        if not content:
            return 0
        print("assistant> ", end="", flush=True)
        try:
            _stream_reply(client, session_id, content, max_tokens)
        except httpx.HTTPError as exc:
            # The server may come back: the next message tries again.
            print(f"\n[error] {request_problem(exc, url)}")


def _chat(
    client: httpx.Client, url: str, user_id: str, session_id: str | None, max_tokens: int | None
) -> int:
    try:
        session_id = session_id or _create_session(client, user_id)
    except httpx.HTTPError as exc:
        print(request_problem(exc, url), file=sys.stderr)
        return 1
    except ChatRefusedError as exc:
        print(f"memchat at {url} refused a new session: {exc}", file=sys.stderr)
        return 1
    print(f"session {session_id} (user {user_id}); an empty line or Ctrl-D quits")
    return _converse(client, url, session_id, max_tokens)


def run_chat(
    url: str,
    user_id: str,
    session_id: str | None,
    *,
    max_tokens: int | None,
    api_key: str | None = None,
) -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
    try:
        client = httpx.Client(base_url=url, timeout=timeout, headers=headers)
    except httpx.InvalidURL as exc:
        print(f"memchat chat: {url} is not a URL: {one_line(str(exc))}", file=sys.stderr)
        return 2
    with client:
        try:
            return _chat(client, url, user_id, session_id, max_tokens)
        except KeyboardInterrupt:
            print()
            return INTERRUPTED_STATUS


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
    chat.set_defaults(run=cmd_chat, log_floor=LOG_FLOOR)
