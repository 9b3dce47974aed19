"""``eosink status --html``: the page of a sink whose driver died, opened in a real browser.

The history is real: a driver process (the core's ``SinkRuntime``, the file sink, a SQLite meta
store) commits eight epochs, persists two more and is SIGKILLed
(:func:`harness.driver_killed_with_two_pending`); ``eosink abandon`` gives up
one of them (a recorded loss), the other stays PENDING. The page is opened in Debian's
Chromium (headless, through Playwright): no script error, no request leaves the file, the
four charts drawn with their data, the cards and tables say what the store holds, and a
screenshot of it is kept (``status-page.png`` in the test's directory) to look at.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import driver_killed_with_two_pending

CHROMIUM = "/usr/bin/chromium"
SID = "file:status-page"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eosink._cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


@pytest.fixture(scope="module")
def browser() -> Any:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does: apt-get install chromium)"
    )
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            # As root, without a sandbox; no background connections (the network is closed).
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
            ],
        )
        try:
            yield b
        finally:
            b.close()


def test_status_page_of_a_sink_whose_driver_died(tmp_path: Path, browser: Any) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    out = tmp_path / "out"
    driver_killed_with_two_pending(url, out, SID)
    _cli(
        "abandon", "--metastore-url", url, "--sink-id", SID, "--epoch", "8",
        "--reason", "staging deleted by a lifecycle rule", "--accept-data-loss",
    )  # fmt: skip
    [status] = json.loads(_cli("status", "--metastore-url", url, "--json").stdout)
    assert status["pending_epochs"] == [9] and [x["epoch"] for x in status["losses"]] == [8]

    page = tmp_path / "status.html"
    res = _cli("status", "--metastore-url", url, "--html", str(page))
    assert res.stdout == f"wrote {page}\n", res.stdout
    assert "Warning" not in res.stderr, res.stderr  # matplotlib's, e.g. on a date axis

    tab = browser.new_page(viewport={"width": 1240, "height": 900})
    problems: list[str] = []
    tab.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    tab.on(
        "request",
        lambda r: problems.append(f"fetched {r.url}") if r.url != page.as_uri() else None,
    )
    tab.goto(page.as_uri())
    shot = tmp_path / "status-page.png"
    tab.screenshot(path=str(shot), full_page=True)
    assert problems == [], problems  # self-contained: nothing fetched, nothing failed

    assert tab.locator("h1").inner_text() == SID
    cards = tab.locator(".card").all_inner_texts()
    assert any(c.startswith("7\n") and "last committed epoch" in c for c in cards), cards
    assert any(c.startswith("1\n") and "PENDING, oldest" in c for c in cards), cards
    assert any(c.startswith("1\n") and "recorded losses" in c for c in cards), cards
    assert any("(eosink abandon)" in c for c in cards), cards  # abandon took the sink over

    # Four charts, each drawn (a visible SVG with plotted lines or bars, not the "no data"
    # text), with the legends of what the store holds.
    figures = tab.locator("figure svg")
    assert figures.count() == 4
    for i in range(4):
        box = figures.nth(i).bounding_box()
        assert box and box["width"] > 400 and box["height"] > 150, box
    text = tab.locator(".charts").inner_text()
    assert "no COMMITTED epoch recorded" not in text
    for legend in ("PENDING (age so far)", "loss recorded", "lost (abandoned)", "median"):
        assert legend in text, legend
    # Rows per epoch: one bar per committed epoch, the PENDING one and the lost one.
    rows_chart = tab.locator("figure").nth(2).inner_html()
    assert rows_chart.count('id="patch_') >= 8 + 1 + 1 + 1  # + the axes' background

    tables = tab.locator("table").all_inner_texts()
    pending_table, loss_table = tables[0], tables[1]
    assert "\n9\t" in "\n" + pending_table and "460" in pending_table  # epoch 9: 460 rows
    assert "staging deleted by a lifecycle rule" in loss_table and "420" in loss_table
    recent = tables[-1]
    assert [line.split("\t")[0] for line in recent.splitlines()[1:]] == [
        str(e) for e in range(7, -1, -1)
    ]
    # A copy for whoever looks at the page (CI keeps pytest's base temp directory).
    shutil.copy(shot, tmp_path.parent / "status-page.png")
