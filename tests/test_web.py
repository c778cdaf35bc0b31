"""The web page (``GET /``) in a real headless Chromium, Debian's ``/usr/bin/chromium`` driven by
Playwright's Python package (none of Playwright's own browser builds), against the session's real
gateway: a page read at once shows one box per line over its image; a multi-page TIFF becomes a job
whose live progress reaches done, and a running job can be cancelled; a bad file shows its problem's
title and detail; the lanes panel shows figures; the layout holds at a phone's width; an API key
entered once serves the tab and no other. The page and ``/docs`` load nothing from outside the
gateway. Screenshots go to ``test-artifacts/web/`` (git-ignored). Without a browser: ``/v1/stats``,
``/v1/preview``, and the page's and the documentation's files.
"""

from __future__ import annotations

import io
import re
import secrets
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from PIL import Image

from ocrserve.formats import render_markdown
from tests import needs
from tests.conftest import DATA, Gateway, ground_truth
from tests.jobs_util import numbered_tiff
from tests.test_api import assert_problem
from tests.test_wheel import WORDS

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the browser tests skip, saying so
    sync_playwright = None

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "web"
CHROMIUM = Path("/usr/bin/chromium")
#: Headless and as root; the flags after the third keep Chromium from calling hosts this machine cannot reach.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
API_KEY = "web-test-key"
#: Milliseconds a page may take to show what a test waits for (a job's pages included).
WAIT_MS = 60_000

#: Collects every text the status line shows (a page's texts change faster than a test polls).
RECORD_STATUS = """() => {
  window.statuses = [];
  new MutationObserver((changes) => {
    for (const change of changes) for (const node of change.addedNodes) window.statuses.push(node.textContent);
  }).observe(document.getElementById("status"), { childList: true });
}"""


@pytest.fixture(scope="module")
def browser():
    if sync_playwright is None:
        pytest.skip("playwright is not installed: pip install -e '.[test]'")
    needs.file(CHROMIUM, "chromium")
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_tab(browser):
    """Opens a tab (a context of its own) on a URL; at the end, fails the test if a tab's script
    raised or a tab requested anything from outside the gateway."""
    contexts, faults = [], []

    def open_tab(url: str, viewport: dict = DESKTOP):
        context = browser.new_context(viewport=viewport, accept_downloads=True)
        contexts.append(context)
        tab = context.new_page()
        host = urlsplit(url).netloc
        tab.on("pageerror", lambda error: faults.append(f"script error: {error}"))
        tab.on("request", lambda r: urlsplit(r.url).netloc in ("", host) or faults.append(f"request: {r.url}"))
        tab.goto(url)
        return tab

    yield open_tab
    for context in contexts:
        context.close()
    assert not faults, faults


@pytest.fixture
def page(open_tab, gateway):
    return open_tab(gateway.url + "/")


def shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


def tiff_file(name: str, pages: int) -> dict:
    """A multi-page TIFF of numbered pages, new in every run (jobs answer a known document from the
    dedup cache, which outlives the session gateway)."""
    data = numbered_tiff(pages, first=100_000 + secrets.randbelow(800_000))
    return {"name": name, "mimeType": "image/tiff", "buffer": data}


def read_at_once(page, path: Path) -> dict:
    """Upload ``path`` and return the result the page received from ``POST /v1/ocr``."""
    with page.expect_response(lambda r: r.url.endswith("/v1/ocr"), timeout=WAIT_MS) as answer:
        page.set_input_files("#files", path)
    return answer.value.json()


def test_a_page_read_at_once_shows_its_lines_over_the_page(page):
    result = read_at_once(page, DATA / "phototest.tif")
    lines = result["pages"][0]["lines"]
    assert result["lane"] == "fast" and len(lines) >= 8
    expect(page.locator("#lines li")).to_have_count(len(lines))
    expect(page.locator("#boxes polygon")).to_have_count(len(lines))
    text = page.locator("#lines").inner_text().lower()
    truth = ground_truth("phototest.tif").lower()
    missing = [word for word in WORDS if word in truth and word not in text]
    assert not missing, f"missing {missing} in {text!r}"
    # a TIFF, which Chromium cannot show: its page comes from POST /v1/preview
    expect(page.locator("#page-image")).to_have_attribute("src", re.compile("^blob:"))
    page.wait_for_function("document.getElementById('page-image').naturalWidth > 0", timeout=WAIT_MS)
    expect(page.locator("#page-label")).to_have_text("phototest.tif, page 1 (1 of 1)")

    # keyboard: the lines follow the page's buttons; a focused line highlights its box
    page.get_by_role("button", name="Copy text").focus()
    page.keyboard.press("Tab")
    expect(page.locator("#lines li").first).to_be_focused()
    active = re.compile(r"\bactive\b")
    expect(page.locator('#boxes polygon[data-line="0"]')).to_have_class(active)
    page.keyboard.press("Tab")
    expect(page.locator('#boxes polygon[data-line="1"]')).to_have_class(active)
    # and the reverse: a box under the pointer highlights its line
    page.locator('#boxes polygon[data-line="3"]').hover()
    expect(page.locator('#lines li[data-line="3"]')).to_have_class(active)
    shoot(page, "result-desktop")

    for button, expected in (("Text", result["text"]), ("Markdown", render_markdown(result))):
        with page.expect_download() as download:
            page.get_by_role("button", name=button, exact=True).click()
        assert Path(download.value.path()).read_text(encoding="utf-8") == expected, button
    with page.expect_download() as download:
        page.get_by_role("button", name="JSON", exact=True).click()
    assert download.value.suggested_filename == "phototest.tif.json"


def test_a_multipage_tiff_becomes_a_job_whose_progress_reaches_done(page):
    pages = 6  # above router.fast.max_pages (4): sent as a job
    page.evaluate(RECORD_STATUS)
    page.set_input_files("#files", files=[tiff_file("six.tif", pages)])
    status = page.locator("#status")
    expect(status).to_have_text(f"Job succeeded: {pages} of {pages} pages done, 0 failed.")
    assert page.locator("#progress").evaluate("bar => [bar.value, bar.max]") == [pages, pages]
    shown = page.evaluate("window.statuses")
    assert any(re.fullmatch(rf"Job: [1-{pages - 1}] of {pages} pages done\.", s) for s in shown), shown
    expect(page.get_by_role("button", name="Cancel job")).to_be_hidden()

    expect(page.locator("#page-label")).to_have_text(f"six.tif, page 1 (1 of {pages})")
    expect(page.locator("#lines")).to_contain_text("Page")
    page.get_by_role("button", name="Next page").click()
    expect(page.locator("#page-label")).to_have_text(f"six.tif, page 2 (2 of {pages})")
    expect(page.locator("#lines")).to_contain_text("Page")
    page.wait_for_function("document.getElementById('page-image').naturalWidth > 0", timeout=WAIT_MS)
    shoot(page, "job-done")


def test_a_running_job_can_be_cancelled(page):
    page.set_input_files("#files", files=[tiff_file("thirty.tif", 30)])
    cancel = page.get_by_role("button", name="Cancel job")
    cancel.click()
    expect(page.locator("#status")).to_have_text(re.compile(r"^Job cancelled: \d+ of 30 pages done"))
    expect(cancel).to_be_hidden()


def test_a_bad_file_shows_the_problem(page, http):
    bad = b"these are not the pixels you are looking for"
    problem = assert_problem(http.post("/v1/ocr", files={"file": ("notes.png", bad, "image/png")}), 415, "")
    page.set_input_files("#files", files=[{"name": "notes.png", "mimeType": "image/png", "buffer": bad}])
    error = page.get_by_role("alert")
    expect(error).to_contain_text(problem["title"])
    expect(error).to_contain_text(problem["detail"])
    expect(page.locator("#result-body")).to_be_hidden()
    shoot(page, "error")


def test_the_lanes_panel_shows_figures(page, http):
    http.post("/v1/ocr", files={"file": ("phototest.tif", (DATA / "phototest.tif").read_bytes())})
    rows = page.locator("#lanes-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td").nth(2)).not_to_have_text("0.00")  # the page just read: a rate
    for row, lane in zip(rows.all(), ("fast", "bulk"), strict=True):
        name, queued, in_engine, rate, p95 = row.locator("th, td").all_inner_texts()
        assert name == lane and re.fullmatch(r"\d+ of \d+", queued) and in_engine.isdigit(), (name, queued, in_engine)
        assert re.fullmatch(r"\d+\.\d\d", rate) and re.fullmatch(r"\d+\.\d\d|–", p95), (rate, p95)
    expect(page.locator("#slots")).to_have_text(re.compile(r"^\d+ of \d+$"))
    expect(page.locator("#jobs-queued")).to_have_text(re.compile(r"^\d+$"))
    expect(page.locator("#jobs-running")).to_have_text(re.compile(r"^\d+ \(\d+ pages to go\)$"))


def test_the_page_fits_a_phone(open_tab, gateway):
    page = open_tab(gateway.url + "/", PHONE)
    result = read_at_once(page, DATA / "phototest.tif")
    expect(page.locator("#boxes polygon")).to_have_count(len(result["pages"][0]["lines"]))
    page.wait_for_function("document.getElementById('page-image').naturalWidth > 0", timeout=WAIT_MS)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    for control in ("API key", "Send as"):
        expect(page.get_by_label(control)).to_be_visible()
    shoot(page, "result-phone")


def test_docs_work_offline(page, gateway):
    page.goto(gateway.url + "/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("ocrserve")
    expect(page.locator('.opblock-summary-path[data-path="/v1/stats"]')).to_be_visible()


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory):
    """A gateway that wants an API key, its jobs apart from the session gateway's."""
    data = tmp_path_factory.mktemp("web-keyed")
    gw = Gateway(f"server.api_keys=[{API_KEY}]", f"store.data_dir={data}").wait_ready()
    yield gw
    gw.stop()


def test_an_api_key_entered_once_serves_the_tab(open_tab, keyed_gateway):
    url = keyed_gateway.url + "/"
    page = open_tab(url)
    expect(page.locator("#lanes-status")).to_contain_text("Unauthorized")
    page.get_by_label("API key").fill(API_KEY)
    page.get_by_role("button", name="Use key").click()
    expect(page.locator("#slots")).to_have_text(re.compile(r"^\d+ of \d+$"))
    result = read_at_once(page, DATA / "phototest.tif")
    expect(page.locator("#boxes polygon")).to_have_count(len(result["pages"][0]["lines"]))
    page.reload()
    expect(page.get_by_label("API key")).to_have_value(API_KEY)  # the tab keeps it...
    other = page.context.new_page()
    other.goto(url)
    expect(other.get_by_label("API key")).to_have_value("")  # ...and no other tab has it
    expect(other.locator("#lanes-status")).to_contain_text("Enter a valid API key")


def test_stats_report_lanes_engine_and_jobs(http):
    http.post("/v1/ocr", files={"file": ("phototest.tif", (DATA / "phototest.tif").read_bytes())})
    stats = http.get("/v1/stats").json()
    assert set(stats["lanes"]) == {"fast", "bulk"} and stats["window_s"] == 60
    fast = stats["lanes"]["fast"]
    assert fast["pages_per_s"] > 0 and fast["p95_s"] > 0 and fast["queue_pages"] > 0
    engine = stats["engine"]
    assert engine["ready"] and engine["slots"] >= 1 and 0 <= engine["in_use"] <= engine["limit"]
    assert {"queued", "running", "backlog_pages"} == set(stats["jobs"])
    assert stats["fast_max_pages"] == 4 and stats["cost_unit"] in ("pages", "visual_tokens")
    # what admission reckons now: a one-page request's seconds (test gateways have no latency target)
    assert fast["predicted_s"] > 0 and stats["fast_latency_target_s"] is None and stats["upper_factor"] >= 1
    assert stats["fast_latency_headroom_s"] == 0.0
    schema = http.get("/openapi.json").json()
    assert "Stats" in schema["components"]["schemas"]
    assert "/v1/stats" in schema["paths"] and "/v1/preview" in schema["paths"]


def test_preview_shows_a_tiff_page_at_its_shape(http):
    tiff = (DATA / "testTIFF_multipage.tif").read_bytes()
    response = http.post("/v1/preview", params={"page": 2}, files={"file": ("t.tif", tiff)})
    assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
    preview = Image.open(io.BytesIO(response.content))
    with Image.open(DATA / "testTIFF_multipage.tif") as source:
        source.seek(1)
        width, height = source.size
    assert preview.format == "JPEG" and abs(preview.width / preview.height - width / height) < 0.01
    assert_problem(
        http.post("/v1/preview", params={"page": 3}, files={"file": ("t.tif", tiff)}),
        400,
        "page=3: the document has 2 page",
    )
    assert_problem(http.post("/v1/preview", files={"file": ("x.png", b"nope")}), 415, "")


def test_the_page_and_docs_come_from_the_gateway(http):
    for path in ("/", "/docs", "/redoc"):
        response = http.get(path)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
        linked = re.findall(r'(?:src|href)="([^"#]+)"', response.text)
        assert linked, path
        for target in linked:
            assert not urlsplit(target).netloc, f"{path} links {target}"
            assert http.get(target if target.startswith("/") else "/" + target).status_code == 200, target
