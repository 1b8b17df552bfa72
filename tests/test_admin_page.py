"""The admin page in a real headless Chromium (Debian's chromium and chromedriver, driven
by Selenium): sign in with an admin key, browse to a user's conversation, see the memories
a turn used beside the facts derived from it, correct and delete a fact, and save a
screenshot (artifacts/admin_conversation.png)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.factory import create_app
from app.settings import Settings
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="LOUD SKIP: Debian's chromium and chromium-driver are not installed "
    "(`make test` installs them; the admin page is untested without them)",
)


@pytest.fixture
def settings(tmp_path: Path, sqlite_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=sqlite_url)


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()


async def admin_key(url: str) -> tuple[str, str]:
    engine = create_engine(url)
    try:
        access = AccessRepository(Database(engine))
        _, admin = await access.create_key("ops", "ops", is_admin=True)
        _, app_key = await access.create_key("acme", "acme app")
        return admin, app_key
    finally:
        await engine.dispose()


def fill(base: str, key: str) -> tuple[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
        first = http.post("/v1/sessions", json={"user_id": "alice", "title": "Monday"}).json()
        http.post(
            f"/v1/sessions/{first['id']}/messages",
            json={"content": "My name is Alice and I am allergic to peanuts."},
        ).raise_for_status()
        second = http.post("/v1/sessions", json={"user_id": "alice", "title": "Dinner"}).json()
        http.post(
            f"/v1/sessions/{second['id']}/messages",
            json={"content": "What should I avoid when I cook, given my peanut allergy?"},
        ).raise_for_status()
        http.post(
            f"/v1/sessions/{second['id']}/messages", json={"content": "我住在上海。"}
        ).raise_for_status()
        wait_for_extraction(http)
        return first["id"], second["id"]


def wait_for_extraction(http: httpx.Client) -> None:
    """Facts are extracted in the background: wait until the allergy and the home are in."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        texts = " ".join(f["text"] for f in http.get("/v1/users/alice/facts").json()["facts"])
        if "peanut" in texts and "上海" in texts:
            return
        time.sleep(0.1)
    raise AssertionError(f"facts not extracted: {texts!r}")


async def test_admin_page_in_headless_chromium(settings: Settings, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    admin, app_key = await admin_key(settings.resolved_database_url())
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."] * 10))
    with live_server(app) as base:
        _first, second = fill(base, app_key)
        browser.get(f"{base}/admin")
        assert browser.current_url == f"{base}/admin/login"
        browser.find_element(By.ID, "key").send_keys("mck_wrong")
        browser.find_element(By.ID, "sign-in").click()
        assert "not an active admin key" in browser.find_element(By.ID, "error").text
        browser.find_element(By.ID, "key").send_keys(admin)
        browser.find_element(By.ID, "sign-in").click()
        wait = WebDriverWait(browser, 20)
        wait.until(expected_conditions.url_to_be(f"{base}/admin"))
        users = browser.find_element(By.ID, "users").text
        assert "alice" in users and "acme" in users

        browser.find_element(By.CLASS_NAME, "user-link").click()
        wait.until(expected_conditions.url_contains("/admin/users/"))
        assert "User alice" in browser.find_element(By.TAG_NAME, "h1").text
        facts = browser.find_element(By.CLASS_NAME, "facts").text
        assert "Save" in facts  # extracted facts are listed, editable
        links = browser.find_elements(By.CLASS_NAME, "session-link")
        assert [link.text for link in links] == ["Monday", "Dinner"]
        links[1].click()
        wait.until(expected_conditions.url_contains(second))

        conversation = browser.find_element(By.ID, "conversation").text
        assert "What should I avoid when I cook" in conversation
        assert "我住在上海。" in conversation
        # The turn of this session was sent with Monday's turn as a memory.
        used = browser.find_elements(By.CLASS_NAME, "used")
        assert used and "allergic to peanuts" in used[0].text
        ARTIFACTS.mkdir(exist_ok=True)
        screenshot = ARTIFACTS / "admin_conversation.png"
        assert browser.save_screenshot(str(screenshot))
        assert screenshot.stat().st_size > 10_000
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        # Correct a fact, then delete it, from the user page.
        browser.get(f"{base}/admin")
        browser.find_element(By.CLASS_NAME, "user-link").click()
        wait.until(expected_conditions.url_contains("/admin/users/"))
        row = browser.find_element(By.CSS_SELECTOR, "table.facts tr[id^='fact-']")
        fact_id = int(row.get_attribute("id").removeprefix("fact-"))
        field = row.find_element(By.CLASS_NAME, "fact-text")
        field.clear()
        field.send_keys("Alice is allergic to peanuts and tree nuts")
        row.find_element(By.CLASS_NAME, "save").click()
        wait.until(expected_conditions.staleness_of(row))  # the page was posted and reloaded
        row = browser.find_element(By.ID, f"fact-{fact_id}")
        assert row.find_element(By.CLASS_NAME, "fact-text").get_attribute("value") == (
            "Alice is allergic to peanuts and tree nuts"
        )
        row.find_element(By.CLASS_NAME, "delete").click()
        wait.until(expected_conditions.staleness_of(row))
        assert "deleted" in browser.find_element(By.ID, f"fact-{fact_id}").text

        # Erasing asks first (the page's own script, allowed by its policy's nonce).
        browser.find_element(By.ID, "erase").click()
        wait.until(expected_conditions.alert_is_present())
        assert browser.switch_to.alert.text.startswith("Erase every message")
        browser.switch_to.alert.dismiss()
        assert browser.find_element(By.ID, f"fact-{fact_id}")  # nothing was posted

        browser.get(f"{base}/admin/audit")
        audit = browser.find_element(By.ID, "audit").text
        assert "fact.delete" in audit and "fact.update" in audit
        # The page's style applies under its Content-Security-Policy, and nothing on
        # any page was blocked by it.
        header = browser.find_element(By.TAG_NAME, "header")
        assert header.value_of_css_property("background-color") == "rgba(29, 36, 48, 1)"
        blocked = [
            entry["message"]
            for entry in browser.get_log("browser")
            if "Content Security Policy" in entry["message"]
        ]
        assert blocked == []
