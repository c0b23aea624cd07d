"""The dashboard's page in a real headless Chromium (Debian's chromium and chromium-driver, installed
by ``make setup``): it loads and lists the rollout, shows a rollout advance, performs an action with
the real reconciler answering, shows a refusal's reason, and a page from another local origin can
neither drive nor read it."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from canary.dashboard.server import TOKEN_HEADER, Dashboard
from canary.rollout.state import Phase
from tests.dashboard.conftest import CANARY, Controller, World

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
T = TypeVar("T")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    # Never skipped: `make setup` installs both; a missing browser is a broken machine, said loudly.
    assert shutil.which(CHROMEDRIVER) and shutil.which(CHROMIUM), (
        "tests/dashboard need Debian's chromium and chromium-driver: run `make setup`"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    # The system's driver, named explicitly: selenium-manager would try to download one.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], T], timeout: float = 10.0) -> T:
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def open_dashboard(browser: WebDriver, board: Dashboard) -> None:
    browser.get(board.url)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#rollouts tbody tr[data-key="ml/llama"]'))


def cells(browser: WebDriver) -> list[str]:
    """The rollout's row as shown, read at once (the table is redrawn at every poll)."""
    found: list[str] = browser.execute_script(
        "const row = document.querySelector('#rollouts tbody tr[data-key=\"ml/llama\"]');"
        "return row ? [...row.cells].map((cell) => cell.textContent) : [];"
    )
    return found


def select(browser: WebDriver) -> None:
    browser.execute_script("document.querySelector('#rollouts tbody tr[data-key=\"ml/llama\"]').click()")


def test_the_page_loads_lists_the_rollout_and_shows_it_advance(
    world: World, dashboard: Dashboard, browser: WebDriver
) -> None:
    world.start_rollout()
    open_dashboard(browser, dashboard)
    assert browser.current_url == f"{dashboard.origin}/", "the token left the address bar"
    row = cells(browser)
    assert row[:7] == ["ml", "llama", "Progressing", CANARY, "llama-predictor-00001", "10%", "1 (10%)"]
    select(browser)
    detail = browser.find_element(By.ID, "detail")
    wait_for(browser, lambda _: detail.get_attribute("data-step") == "1")
    # What each revision serves (the first revision was never rolled out while the controller
    # watched: KServe keeps no spec of it, so it is unknown).
    artefacts = browser.find_element(By.ID, "detail-artefacts").text
    assert artefacts == "canary serves s3://m/v2 (format sklearn) · stable serves unknown"
    # The traffic chart and the decisions, with their reasons.
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#charts svg.chart polyline"))
    decisions = browser.find_element(By.ID, "decisions").text
    assert f"Starting the rollout of {CANARY}" in decisions
    # The controller moves the rollout on: the page follows without a reload.
    world.advance_stored_state()
    wait_for(browser, lambda _: cells(browser)[6] == "2 (30%)")
    wait_for(browser, lambda _: detail.get_attribute("data-step") == "2")
    assert "step 2 (30%)" in browser.find_element(By.ID, "detail-summary").text


def _act(browser: WebDriver, action: str) -> str:
    browser.find_element(By.CSS_SELECTOR, f'#actions button[data-action="{action}"]').click()
    result = browser.find_element(By.ID, "action-result")
    wait_for(browser, lambda _: result.get_attribute("class") not in ("", "waiting"), timeout=20)
    return f"{result.get_attribute('class')}: {result.text}"


def test_an_action_works_and_a_refusal_shows_its_reason(
    world: World, dashboard: Dashboard, browser: WebDriver
) -> None:
    world.start_rollout()
    open_dashboard(browser, dashboard)
    select(browser)
    detail = browser.find_element(By.ID, "detail")
    wait_for(browser, lambda _: detail.get_attribute("data-phase") == "Progressing")
    # Impossible now: the button is disabled, and says why (the core's own reason).
    resume = browser.find_element(By.CSS_SELECTOR, '#actions button[data-action="resume"]')
    wait_for(browser, lambda _: resume.get_attribute("disabled") is not None)
    assert resume.get_attribute("title") == "the rollout is not paused (phase Progressing)"
    # The controller refuses (its clock is two hours ahead: the command is expired to it).
    world.clock.offset = timedelta(hours=2)
    with Controller(world):
        refused = _act(browser, "pause")
    assert refused.startswith("refused: pause refused (the controller): pause was issued at")
    assert refused.endswith("expired, refused")
    assert world.stored().state().phase is Phase.PROGRESSING
    # Accepted by the real reconciler; the table shows the rollout paused.
    world.clock.offset = timedelta()
    with Controller(world):
        assert (
            _act(browser, "pause") == f"accepted: pause accepted (the controller): rollout of {CANARY} paused"
        )
    wait_for(browser, lambda _: cells(browser)[2] == "Paused")
    assert world.stored().state().phase is Phase.PAUSED
    wait_for(
        browser, lambda d: "pause by kubernetes-admin accepted" in d.find_element(By.ID, "last-command").text
    )


def _button(browser: WebDriver, action: str) -> WebElement:
    return browser.find_element(By.CSS_SELECTOR, f'#actions button[data-action="{action}"]')


def test_abort_and_promote_ask_first_and_a_finished_rollout_offers_no_action(
    world: World, dashboard: Dashboard, browser: WebDriver
) -> None:
    world.start_rollout()
    open_dashboard(browser, dashboard)
    select(browser)
    wait_for(browser, lambda _: _button(browser, "abort").get_attribute("disabled") is None)
    for action in ("abort", "promote"):
        _button(browser, action).click()
        question = wait_for(browser, lambda d: d.switch_to.alert)
        assert CANARY in question.text and "ml/llama" in question.text
        question.dismiss()  # no: nothing is issued
    assert world.stored().command_json is None
    assert browser.find_element(By.ID, "action-result").text == ""
    # Rolled back: nothing to pause, resume, approve, abort or promote; each button says why.
    with Controller(world):
        _button(browser, "abort").click()
        wait_for(browser, lambda d: d.switch_to.alert).accept()
        wait_for(browser, lambda _: world.stored().state().phase is Phase.ROLLED_BACK, timeout=20)
    wait_for(browser, lambda _: cells(browser)[2] == "RolledBack")
    wait_for(
        browser,
        lambda d: all(
            b.get_attribute("disabled") for b in d.find_elements(By.CSS_SELECTOR, "#actions button")
        ),
    )
    assert _button(browser, "pause").get_attribute("title").startswith("no rollout in progress")


class _Elsewhere(BaseHTTPRequestHandler):
    """Another local web page (another port, so another origin but the same site): it tries to drive
    the dashboard by fetch and by form, and to read it, and writes what happened into its DOM."""

    target = ""

    def do_GET(self) -> None:
        target = type(self).target
        page = f"""<!DOCTYPE html><html><body>
<form id="form" method="POST" action="{target}/api/rollouts/ml/llama/abort" target="sink"
      enctype="text/plain"><input name='{{"x":"' value='"}}'></form>
<iframe name="sink"></iframe>
<pre id="log"></pre>
<script>
const log = (line) => {{ document.getElementById("log").textContent += line + "\\n"; }};
async function attempt(name, request) {{
  try {{
    const response = await request();
    let body = "";
    try {{ body = await response.text(); }} catch (e) {{ body = "unreadable"; }}
    log(name + ": read " + response.status + " " + body.slice(0, 80));
  }} catch (error) {{
    log(name + ": blocked " + error.name);
  }}
}}
(async () => {{
  await attempt("json-post", () => fetch("{target}/api/rollouts/ml/llama/abort", {{
    method: "POST", credentials: "include", headers: {{"Content-Type": "application/json",
    "{TOKEN_HEADER}": "guessed"}}, body: "{{}}"}}));
  await attempt("simple-post", () => fetch("{target}/api/rollouts/ml/llama/pause", {{
    method: "POST", credentials: "include", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
    body: "{{}}"}}));
  await attempt("read-list", () => fetch("{target}/api/rollouts", {{credentials: "include"}}));
  await attempt("read-page", () => fetch("{target}/", {{credentials: "include"}}));
  document.getElementById("form").submit();
  setTimeout(() => log("done"), 1500);
}})();
</script></body></html>"""
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        return


def test_a_page_from_another_origin_can_neither_drive_nor_read_the_dashboard(
    world: World, dashboard: Dashboard, browser: WebDriver
) -> None:
    world.start_rollout()
    # The person has the dashboard open: the browser holds its cookie.
    open_dashboard(browser, dashboard)
    before = world.stored()
    _Elsewhere.target = dashboard.origin
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Elsewhere)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
        log = browser.find_element(By.ID, "log")
        wait_for(browser, lambda _: "done" in log.text, timeout=15)
        lines = dict(line.split(": ", 1) for line in log.text.splitlines() if ": " in line)
    finally:
        server.shutdown()
        server.server_close()
    # The preflight is refused, so the JSON POST is never sent; a no-cors POST is sent, refused (no
    # token header, not JSON) and its answer withheld from the page (Cross-Origin-Resource-Policy);
    # reads are blocked by the absence of any CORS header.
    assert lines["json-post"] == "blocked TypeError"
    assert lines["simple-post"] == "blocked TypeError"
    assert lines["read-list"] == "blocked TypeError"
    assert lines["read-page"] == "blocked TypeError"
    after = world.stored()
    assert after.resource_version == before.resource_version, "nothing was written"
    assert after.command_json is None
    assert after.state().phase is Phase.PROGRESSING
