"""The turn inspector of the admin page in a real headless Chromium, on SQLite and on
PostgreSQL, for an English and a Chinese turn posted through the API: the prompt's bar is
drawn to the stored token counts, the memory rows are the stored report's, and stored
text (the injection corpus, and markup) shows as text, never as page. Screenshots go to
artifacts/inspector_{en,zh}.png (docs/images holds copies).

Also, without a browser: the admin API's JSON of the same report, its problem details
for an unknown turn, and the access rules of both."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.factory import create_app
from app.settings import ChatSettings, Settings
from retrieval.chat.turn_report import MAX_LEFT_OUT
from storage.db import Database, create_engine
from storage.messages import MessageRepository
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server
from tests.test_admin_page import ARTIFACTS, admin_key, browser, pytestmark  # noqa: F401
from tests.test_prompt_injection import CORPUS

# Markup and template syntax besides the corpus's prompt injections.
MARKUP = [
    "<script>window.__injected = 1</script> tea",
    '<img src="x" onerror="window.__injected = 2"> tea',
    '"><svg onload="window.__injected = 3"></svg> tea',
    "{{ 7 * 7 }} {% if true %}tea{% endif %}",
    '</td></tr></table><h1 id="forged">forged heading</h1> tea',
    "&lt;b&gt; tea &amp; an entity",
    "<style>body { display: none }</style> 茶",
]
ENGLISH = [t for t in CORPUS if not any("\u4e00" <= c <= "\u9fff" for c in t)]
CHINESE = [t for t in CORPUS if t not in ENGLISH]
WHEN = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)
TURNS = {
    "en": {
        "user": "alice",
        # Copies of a stored turn are left out as near duplicates (three: the session's
        # first turn shows one, which the inspected second turn then excludes).
        "history": [*ENGLISH, *MARKUP, *ENGLISH[:1] * 2, "I drink green tea every morning."],
        "facts": [
            ("Alice is allergic to peanuts", "allergy"),
            ("Alice lives in Paris", "home"),
            ("Alice lives in Lyon", "home"),  # supersedes Paris
        ],
        "question": "What tea do I drink in the morning?",
    },
    "zh": {
        "user": "xiaoming",
        "history": [*CHINESE, *MARKUP, *CHINESE[:1] * 2, "我每天早上喝绿茶。"],
        "facts": [
            ("小明对花生过敏", "allergy"),
            ("小明住在北京", "home"),
            ("小明住在上海", "home"),
        ],
        "question": "我早上喝什么茶？",
    },
}


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    # A memory budget that the stored turns overflow: some are left out for it.
    chat = ChatSettings(memory_max_tokens=80, memory_min_tokens=40)
    return Settings(data_dir=tmp_path / "data", database_url=database_url, chat=chat)


def make_app(settings: Settings):
    return create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 10))


def post_turn(http: httpx.Client, language: str) -> tuple[str, int]:
    """A user's history and pinned facts, then a turn in a new session: (session id,
    the turn's message id)."""
    spec = TURNS[language]
    user = spec["user"]
    for text, subject in spec["facts"]:
        http.post(
            f"/v1/users/{user}/facts", json={"text": text, "subject": subject, "pinned": True}
        ).raise_for_status()
    old = http.post("/v1/sessions", json={"user_id": user, "title": "History"}).json()
    history = [
        {
            "role": "user",
            "content": text,
            "created_at": (WHEN + dt.timedelta(minutes=i)).isoformat(),
        }
        for i, text in enumerate(spec["history"])
    ]
    http.post(f"/v1/sessions/{old['id']}/history", json={"messages": history}).raise_for_status()
    new = http.post("/v1/sessions", json={"user_id": user, "title": "今天 / today"}).json()
    # The inspected turn is the session's second: its window holds the first, and its
    # prompt shares a prefix with the first's.
    for content in (spec["history"][-1], spec["question"]):
        http.post(
            f"/v1/sessions/{new['id']}/messages", json={"content": content}
        ).raise_for_status()
    turn = http.get(f"/v1/sessions/{new['id']}/messages").json()["messages"][2]
    return new["id"], int(turn["id"])


async def stored_report(url: str, session_id: str, message_id: int) -> tuple[dict[str, Any], dict]:
    """The stored report, read from the database itself, and the texts of its memories."""
    engine = create_engine(url)
    try:
        messages = MessageRepository(Database(engine))
        found = await messages.get_reported_turn(session_id, message_id)
        assert found.report is not None
        ids = [m["id"] for m in [*found.report["memories"], *found.report["left_out"]]]
        rows = await messages.list_messages_by_id(found.message.user_pk, ids)
        return found.report, {t.id: t for t in rows}
    finally:
        await engine.dispose()


def score(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def as_parsed(text: str) -> str:
    """Text as an HTML parser hands it to the page (line breaks normalised)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def check_bar(driver, report: dict[str, Any]) -> None:
    """Each section is drawn as wide as its share of the prompt's stored tokens."""
    from selenium.webdriver.common.by import By

    bar = driver.find_element(By.ID, "prompt-bar")
    total = report["prompt_tokens"]
    assert sum(report["sections"].values()) == total
    width = driver.execute_script("return arguments[0].clientWidth", bar)
    left = driver.execute_script("return arguments[0].getBoundingClientRect().left", bar)
    drawn = {}
    start = 0.0
    for rect in bar.find_elements(By.CSS_SELECTOR, "rect.seg"):
        name = rect.get_attribute("data-section")
        box = driver.execute_script("return arguments[0].getBoundingClientRect()", rect)
        drawn[name] = int(rect.get_attribute("data-tokens"))
        assert box["width"] == pytest.approx(width * drawn[name] / total, abs=0.5), name
        # Drawn in the prompt's order, each from where the one before it ends.
        assert box["left"] - left - bar.get_property("clientLeft") == pytest.approx(
            width * start / total, abs=0.5
        ), name
        start += drawn[name]
    assert drawn == {name: n for name, n in report["sections"].items() if n > 0}
    cached = report["cached_prompt_tokens"] or report["prefix_reuse"]
    if cached:
        mark = driver.find_element(By.ID, "cached-prefix")
        box = driver.execute_script("return arguments[0].getBoundingClientRect()", mark)
        assert box["width"] == pytest.approx(width * cached / total, abs=0.5)


def check_rows(driver, table: str, memories: list[dict], rows: dict) -> None:
    """The table's rows are the stored report's memories, in order, with its scores and
    days, and each memory's stored text shown exactly as text."""
    from selenium.webdriver.common.by import By

    shown = driver.find_elements(By.CSS_SELECTOR, f"#{table} tr.memory")
    assert [r.get_attribute("id").rpartition("-")[2] for r in shown] == [
        str(m["id"]) for m in memories
    ]
    for row, memory in zip(shown, memories, strict=True):
        cells = {
            name: row.find_element(By.CLASS_NAME, name).get_attribute("textContent")
            for name in ("day", "dense", "lexical", "fused", "text")
        }
        turn = rows[memory["id"]]
        # A near duplicate's day is its row's (the search read no row of it).
        assert cells["day"] == (memory["day"] or turn.created_at.date().isoformat())
        for name in ("dense", "lexical", "fused"):
            assert cells[name] == score(memory[name]), (memory["id"], name)
        assert cells["text"] == f"{turn.role}: {as_parsed(turn.content)}"
        if table == "left-out":
            assert row.find_element(By.CLASS_NAME, "reason").text == memory["reason"]


def check_nothing_injected(driver) -> None:
    from selenium.webdriver.common.by import By

    assert driver.execute_script("return window.__injected === undefined")
    assert driver.execute_script("return document.scripts.length") == 1  # the page's own
    assert driver.find_elements(By.ID, "forged") == []
    assert driver.find_elements(By.CSS_SELECTOR, "[onerror], [onload]") == []
    assert driver.find_elements(By.CSS_SELECTOR, "main style, main img, main script") == []
    assert driver.find_element(By.TAG_NAME, "body").is_displayed()


async def test_inspector_in_headless_chromium(
    settings: Settings,
    database_url: str,
    browser,  # noqa: F811 - the fixture of tests/test_admin_page.py
) -> None:
    from selenium.webdriver.common.by import By

    browser.implicitly_wait(0)  # the page is whole when loaded; absent elements are checked
    app = make_app(settings)
    with live_server(app) as base:
        with httpx.Client(base_url=base, timeout=30) as http:
            turns = {language: post_turn(http, language) for language in TURNS}
        for language, (session_id, message_id) in turns.items():
            report, rows = await stored_report(database_url, session_id, message_id)
            user_pk = rows[report["memories"][0]["id"]].user_pk
            # The way in: the conversation links the turn to its inspector.
            browser.get(f"{base}/admin/users/{user_pk}/sessions/{session_id}")
            browser.find_elements(By.CLASS_NAME, "inspect")[-1].click()
            assert browser.current_url.endswith(f"/sessions/{session_id}/turns/{message_id}")
            main = browser.find_element(By.TAG_NAME, "main").text
            assert TURNS[language]["question"] in main

            check_bar(browser, report)
            check_rows(browser, "memories", report["memories"], rows)
            check_rows(browser, "left-out", report["left_out"], rows)
            check_nothing_injected(browser)
            # Every stored text the report names is on the page, markup and all.
            shown = {rows[m["id"]].content for m in [*report["memories"], *report["left_out"]]}
            assert shown & set(MARKUP)
            reasons = {m["reason"] for m in report["left_out"]}
            assert {"budget", "duplicate"} <= reasons, report["num_left_out"]
            assert report["prefix_reuse"] > 0 and report["sections"]["recent"] > 0
            assert len(report["left_out"]) == min(
                MAX_LEFT_OUT, sum(report["num_left_out"].values())
            )

            facts = TURNS[language]["facts"]
            pinned = browser.find_element(By.ID, "facts-pinned").text
            assert facts[0][0] in pinned and facts[2][0] in pinned
            left = browser.find_element(By.ID, "facts-left-out").text
            assert facts[1][0] in left and "superseded" in left
            timings = browser.find_elements(By.CSS_SELECTOR, "#timings td.num")
            assert len(timings) == 7
            assert float(timings[0].text) == pytest.approx(
                1000 * report["timings"]["embed_s"], abs=0.1
            )

            if database_url.startswith("sqlite"):
                ARTIFACTS.mkdir(exist_ok=True)
                screenshot = ARTIFACTS / f"inspector_{language}.png"
                browser.set_window_size(1400, 2200)
                assert browser.save_screenshot(str(screenshot))
                assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_turn_report_in_the_admin_api(settings: Settings) -> None:
    admin, app_key = await admin_key(settings.resolved_database_url())
    app = make_app(settings)
    with live_server(app) as base, httpx.Client(base_url=base, timeout=30) as http:
        http.headers["Authorization"] = f"Bearer {app_key}"
        session_id, message_id = post_turn(http, "en")
        path = f"/users/1/sessions/{session_id}/turns/{message_id}"
        # An application's key reaches neither the JSON nor the page.
        assert http.get(f"/admin/v1{path}").status_code == 403
        assert http.get(f"/admin{path}", follow_redirects=False).status_code in (303, 403)
        http.headers["Authorization"] = f"Bearer {admin}"
        answer = http.get(f"/admin/v1{path}")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        report, _rows = await stored_report(
            settings.resolved_database_url(), session_id, message_id
        )
        assert body["report"] == report
        assert body["message"]["id"] == message_id and body["reply"]["content"] == "Noted."
        missing = http.get(f"/admin/v1/users/1/sessions/{session_id}/turns/{message_id + 99}")
        assert missing.status_code == 404
        assert missing.headers["content-type"].startswith("application/problem+json")
        assert missing.json()["detail"] == f"message {message_id + 99} not found"
        # The reply is no turn of its own: no report to show for it.
        reply = http.get(f"/admin/v1/users/1/sessions/{session_id}/turns/{message_id + 1}")
        assert reply.status_code == 404
