"""The chat page at / in headless Chromium: a prompt streams a reply, drafted text is marked, stats show."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import sync_playwright

from tests.live import ARTIFACTS, LiveServer

CHROMIUM = shutil.which("chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def drafting_server() -> Iterator[LiveServer]:
    # A fixed γ: with γ auto, whether anything is drafted is the controller's call on this machine's cost curve
    # (on one thread verifying is nearly linear, and it rightly drafts nothing), and the marks would not show.
    with LiveServer.start("--gamma", "4") as s:
        yield s


@pytest.mark.skipif(CHROMIUM is None, reason="needs the system chromium (make setup installs it)")
def test_chat_page_streams_reply_with_draft_marks_and_stats(drafting_server: LiveServer) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.goto(drafting_server.url + "/")
            page.wait_for_selector("#model option[value='smollm2-135m']", state="attached", timeout=10_000)
            page.fill("#max-tokens", "48")
            page.fill("#prompt", "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.")
            page.click("#send")
            reply = page.locator(".msg.assistant").last
            stats = reply.locator(".stats")
            stats.filter(has_text="acceptance").wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "chat_page.png"))
            text = reply.locator(".body").inner_text()
            line = stats.inner_text()
            assert "quick brown fox" in text
            assert "tok/s" in line and "mode ngram" in line and "first token" in line
            generated = re.match(r"(\d+) tokens · ", line)  # the model may end its reply before the 48 asked for
            assert generated and 0 < int(generated.group(1)) <= 48
            # Prompt lookup drafts the repeated sentence: some of the reply is marked as drafted text.
            drafted = reply.locator(".body .draft").all_inner_texts()
            assert drafted and all(d in text for d in drafted)
            assert page.inner_text("#send") == "Send"  # the stream ended
        finally:
            browser.close()
