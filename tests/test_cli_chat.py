"""`memchat chat` on a terminal (a pseudo-terminal, and a tmux pane), against a live
server: the screen holds the conversation and each turn's summary line, no log line, and
whatever goes wrong as one line."""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from app.cli.chat import answer_problem, request_problem
from app.factory import create_app
from app.settings import Settings
from retrieval.errors import EngineError
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import MEMCHAT, cli_env, free_port, live_server

UNKNOWN_SESSION = "0b0c0d0e-0000-4000-8000-0000000000ff"


class Terminal:
    """A command on a pseudo-terminal: the screen (its standard output and error, and the
    echo of what was typed, as a terminal shows them) and a keyboard."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self._keyboard, tty = pty.openpty()
        self.process = subprocess.Popen(argv, stdin=tty, stdout=tty, stderr=tty, env=env)
        os.close(tty)
        self._output = b""

    @property
    def screen(self) -> str:
        return self._output.decode(errors="replace").replace("\r\n", "\n")

    def type(self, text: str) -> None:
        os.write(self._keyboard, text.encode())

    def wait_for(self, text: str, times: int = 1, timeout_s: float = 60) -> None:
        """Until `text` is on the screen `times` times: type only at a prompt, or the echo
        of the keys would come before it."""
        deadline = time.monotonic() + timeout_s
        while self.screen.count(text) < times:
            if not self._read(deadline - time.monotonic()):
                pytest.fail(f"{text!r} never appeared on the screen:\n{self.screen}")

    def wait_for_exit(self, timeout_s: float = 60) -> int:
        deadline = time.monotonic() + timeout_s
        while self._read(deadline - time.monotonic()):
            pass
        return self.process.wait(timeout=max(deadline - time.monotonic(), 1))

    def converse(self, *messages: str, seen: int = 0) -> int:
        """Types each message at its prompt, then an empty line to quit; the exit code.
        `seen`: how many prompts were already waited for."""
        for number, message in enumerate([*messages, ""], start=1):
            if number > seen:
                self.wait_for("you> ", times=number)
            self.type(message + "\n")
        return self.wait_for_exit()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self._keyboard)

    def _read(self, timeout_s: float) -> bool:
        """Reads what the command wrote; False once it has closed the terminal (or at the
        deadline)."""
        if timeout_s <= 0 or not select.select([self._keyboard], [], [], timeout_s)[0]:
            return False
        try:
            chunk = os.read(self._keyboard, 4096)
        except OSError:  # EIO: the command has ended and closed its side
            return False
        self._output += chunk
        return bool(chunk)


@contextmanager
def chat(base: str, tmp_path: Path, *args: str, log_level: str = "info") -> Iterator[Terminal]:
    env = cli_env(tmp_path) | {"MEMCHAT_LOG_LEVEL": log_level}
    terminal = Terminal([*MEMCHAT, "chat", "--url", base, *args], env)
    try:
        yield terminal
    finally:
        terminal.close()


def lines(screen: str) -> list[str]:
    return re.sub(r"session [0-9a-f-]{36} ", "session S ", screen).splitlines()


@pytest.fixture
def settings(tmp_path: Path, sqlite_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=sqlite_url)


@pytest.mark.parametrize("log_level", ["info", "debug"])
def test_the_screen_holds_the_conversation_and_the_summary_lines_only(
    settings: Settings, tmp_path: Path, log_level: str
) -> None:
    engine = ScriptedEngine(["Teal is a fine colour.", "You said teal."])
    with (
        live_server(create_app(settings, embedder=HashEmbedder(), engine=engine)) as base,
        chat(base, tmp_path, "--user-id", "zoe", log_level=log_level) as terminal,
    ):
        said = ("My favourite colour is teal.", "What is my favourite colour?")
        assert terminal.converse(*said) == 0
    assert lines(terminal.screen) == [
        "session S (user zoe); an empty line or Ctrl-D quits",
        "you> My favourite colour is teal.",
        "assistant> Teal is a fine colour.",
        "[5 tokens, 0 memories used]",
        "you> What is my favourite colour?",
        "assistant> You said teal.",
        "[3 tokens, 0 memories used]",
        "you> ",
    ]


def test_an_error_answer_and_a_failed_engine_are_one_line_each(
    settings: Settings, tmp_path: Path
) -> None:
    engine = ScriptedEngine(["Noted."])
    app = create_app(settings, embedder=HashEmbedder(), engine=engine)
    with live_server(app) as base:
        with chat(base, tmp_path, "--session-id", UNKNOWN_SESSION) as terminal:
            assert terminal.converse("Hello?") == 0
        assert lines(terminal.screen)[1:] == [
            "you> Hello?",
            f"assistant> [error 404] session '{UNKNOWN_SESSION}' not found",
            "you> ",
        ]
        engine.fail_with = EngineError("the model crashed")
        with chat(base, tmp_path) as terminal:
            assert terminal.converse("Hello?") == 0
        assert lines(terminal.screen)[1:] == [
            "you> Hello?",
            "assistant> ",
            "[error] the LLM engine failed: the model crashed. Your message was stored; retry"
            " later.",
            "you> ",
        ]


def test_a_server_gone_mid_chat_is_one_line_and_the_chat_goes_on(
    settings: Settings, tmp_path: Path
) -> None:
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."]))
    with ExitStack() as stack:
        with live_server(app) as base:
            terminal = stack.enter_context(chat(base, tmp_path))
            terminal.wait_for("you> ")
        # The server has stopped; the chat has not.
        assert terminal.converse("Still there?", seen=1) == 0
    assert lines(terminal.screen)[1:] == [
        "you> Still there?",
        "assistant> ",
        f"[error] cannot reach memchat at {base}: [Errno 111] Connection refused",
        "you> ",
    ]


class TmuxPane:
    """A command in a detached tmux session on a server of its own (its own socket, in
    `directory`, and an empty configuration), so that the test never touches anyone's
    sessions: the screen as tmux draws it (`capture-pane`) and a keyboard (`send-keys`).
    The command's exit status goes to a file beside the socket: tmux's `pane_dead_status`
    is at times still empty once the pane is dead."""

    def __init__(
        self, tmux: str, directory: Path, argv: Sequence[str], env: Mapping[str, str]
    ) -> None:
        self._tmux = [tmux, "-u", "-f", os.devnull, "-S", str(directory / "tmux.socket")]
        self._status = directory / "exit-status"
        command = f"{shlex.join(argv)}; echo $? > {shlex.quote(str(self._status))}"
        self._run("new-session", "-d", "-s", "chat", "-x", "120", "-y", "40", command, env=env)
        # The pane stays on the screen once the command has ended (to show why it did).
        self._run("set-option", "-t", "chat", "remain-on-exit", "on")

    def _run(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        done = subprocess.run(
            [*self._tmux, *args], env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    @property
    def screen(self) -> list[str]:
        """The pane's lines, wrapped lines joined, without the empty ones below the last."""
        lines = self._run("capture-pane", "-p", "-J", "-t", "chat").splitlines()
        while lines and not lines[-1].strip():
            lines.pop()
        return [line.rstrip() for line in lines]

    def type(self, text: str) -> None:
        if text:
            self._run("send-keys", "-t", "chat", "-l", text)
        self._run("send-keys", "-t", "chat", "Enter")

    def wait_for_prompt(self, number: int, timeout_s: float = 60) -> None:
        """Until the chat's `number`th prompt is in the pane: type only at a prompt."""
        deadline = time.monotonic() + timeout_s
        while sum(line.startswith("you>") for line in self.screen) < number:
            if time.monotonic() > deadline:
                pytest.fail(f"no prompt {number} in the pane:\n" + "\n".join(self.screen))
            time.sleep(0.05)

    def exit_status(self, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._status.exists() and self._status.read_text().endswith("\n"):
                return int(self._status.read_text())
            time.sleep(0.05)
        pytest.fail("the chat did not end:\n" + "\n".join(self.screen))

    def close(self) -> None:
        subprocess.run([*self._tmux, "kill-server"], capture_output=True, timeout=30)


def test_in_tmux_the_pane_holds_the_conversation_and_one_line_per_error(
    settings: Settings, tmp_path: Path
) -> None:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed: `memchat chat` in tmux is NOT TESTED (make tmux)")
    engine = ScriptedEngine(["Teal is a fine colour.", "你最喜欢青色。"])
    env = cli_env(tmp_path) | {"MEMCHAT_LOG_LEVEL": "debug", "LC_ALL": "C.UTF-8"}
    argv = [*MEMCHAT, "chat", "--user-id", "zoe"]
    pane = None
    try:
        with live_server(create_app(settings, embedder=HashEmbedder(), engine=engine)) as base:
            pane = TmuxPane(tmux, tmp_path, [*argv, "--url", base], env)
            for number, message in enumerate(
                ("My favourite colour is teal.", "我最喜欢什么颜色？"), start=1
            ):
                pane.wait_for_prompt(number)
                pane.type(message)
            pane.wait_for_prompt(3)
        # The server has stopped; the chat has not.
        pane.type("Still there?")
        pane.wait_for_prompt(4)
        screen = pane.screen
        pane.type("")
        assert pane.exit_status() == 0
    finally:
        if pane is not None:
            pane.close()
    assert lines("\n".join(screen)) == [
        "session S (user zoe); an empty line or Ctrl-D quits",
        "you> My favourite colour is teal.",
        "assistant> Teal is a fine colour.",
        "[5 tokens, 0 memories used]",
        "you> 我最喜欢什么颜色？",
        "assistant> 你最喜欢青色。",
        "[1 tokens, 0 memories used]",
        "you> Still there?",
        "assistant>",
        f"[error] cannot reach memchat at {base}: [Errno 111] Connection refused",
        "you>",
    ]


def test_no_server_is_one_line(tmp_path: Path) -> None:
    base = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [*MEMCHAT, "chat", "--url", base],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"cannot reach memchat at {base}: [Errno 111] Connection refused\n"


@pytest.mark.parametrize(
    ("response", "line"),
    [
        (
            httpx.Response(
                401,
                json={
                    "type": "about:blank",
                    "title": "Unauthorized",
                    "status": 401,
                    "detail": "no API key\n(send Authorization: Bearer ...)",
                    "instance": "/v1/sessions",
                },
            ),
            "[error 401] no API key (send Authorization: Bearer ...)",
        ),
        (
            httpx.Response(
                422,
                json={
                    "detail": "invalid body",
                    "errors": [{"field": "content", "message": "must not be blank"}],
                },
            ),
            "[error 422] invalid body (content: must not be blank)",
        ),
        (httpx.Response(502, text="<html><h1>Bad Gateway</h1></html>"), "[error 502] Bad Gateway"),
    ],
)
def test_an_error_answer_is_its_status_and_detail(response: httpx.Response, line: str) -> None:
    assert answer_problem(response) == line


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            httpx.ConnectTimeout("timed out"),
            "cannot reach memchat at http://h:1: no connection within 10 s",
        ),
        (httpx.ReadTimeout("timed out"), "memchat at http://h:1 sent nothing for 300 s"),
        (
            httpx.RemoteProtocolError("peer closed connection\nwithout a complete body"),
            "no answer from memchat at http://h:1: peer closed connection without a complete body",
        ),
    ],
)
def test_a_request_without_an_answer_is_one_line(error: httpx.HTTPError, line: str) -> None:
    assert request_problem(error, "http://h:1") == line
