"""`codemode ui` in a real browser: Playwright driving Debian's chromium (`/usr/bin/chromium`, installed by .ci/run).

The page is served by `serve_ui` on the test's dev server, over a worker of the bundled `cart-guarded` agent (its
scripted model writes the $150 add that waits for a person). A person opens the runs page, follows a run live, sees
its nested call appear while the run waits, and approves (or denies) it from the page; the run then finishes. A
hostile run's text is shown escaped and runs no script. With `CODEMODE_SCREENSHOTS=DIR`, the run page and the
approvals view are saved there (docs/images holds the ones the docs show).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright
from pydantic_ai import Agent
from temporalio.client import Client

from durable_codemode import CodeModeAgent, ToolOptions, start_run
from durable_codemode.apps.activities.cart import CartStore
from durable_codemode.apps.workflows import cart
from durable_codemode.debugging import register_agents
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, running_worker, scripted_model
from durable_codemode.ui import UIAccess, serve_ui

pytestmark = pytest.mark.xdist_group("test_ui_browser")  # one browser launched for the module, in one test process

CHROMIUM = "/usr/bin/chromium"
_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync"]
_WAIT_MS = 30_000


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (.ci/run installs it)")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
        yield launched
        await launched.close()


@asynccontextmanager
async def ui(client: Client, access: UIAccess | None = None) -> AsyncIterator[str]:
    """The page's address (with its token), served for the block."""
    urls: list[str] = []
    ready = asyncio.Event()
    task = asyncio.create_task(serve_ui(client, port=0, access=access, announce=urls.append, ready=ready))
    await asyncio.wait_for(ready.wait(), 30)
    try:
        yield urls[0]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def open_page(browser: Browser, url: str) -> tuple[Page, list[str]]:
    """A new page at `url`, and the list its script errors and dialogs (which must never come) go to."""
    page = await browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    page.on("dialog", lambda dialog: problems.append(f"dialog: {dialog.message}"))
    await page.goto(url)
    return page, problems


async def screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("CODEMODE_SCREENSHOTS")
    if folder:
        await page.screenshot(path=str(Path(folder) / name), full_page=True)


def guarded(tmp_path: Path) -> CodeModeAgent:
    store = CartStore(tmp_path / "cart.sqlite")
    store.seed(lines=5)
    return cart.guarded_cart_agent(store)


@pytest.mark.parametrize("approve", [True, False], ids=["approve", "deny"])
async def test_a_person_follows_a_run_live_and_decides_its_paused_call(
        client: Client, browser: Browser, tmp_path: Path, approve: bool) -> None:
    agent = guarded(tmp_path)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True), \
            ui(client, UIAccess(approver="ana")) as url:
        page, problems = await open_page(browser, url)
        handle = await start_run(client, agent, cart.GUARDED_PROMPT, task_queue=tq, stream=True)
        # The runs page lists it (it refreshes on its own), waiting, with the call it made; the person opens it.
        row = page.locator("tr", has=page.locator(f"a:text-is('{handle.id}')"))
        await row.locator("td.waiting", has_text="1 call(s)").wait_for(timeout=_WAIT_MS)
        assert await row.locator("td.calls").inner_text() == "1"
        await page.click(f"a:text-is('{handle.id}')", timeout=_WAIT_MS)
        # The nested call appears, waiting, while the run is not over.
        call = page.locator("li.call.paused", has_text='call_0.0 add_line(product="espresso machine"')
        await call.wait_for(timeout=_WAIT_MS)
        assert await page.get_attribute("#status", "data-status") is None, "the run has not ended"
        pending = page.locator("li.pending", has_text="call_0.0 add_line")
        await pending.wait_for(timeout=_WAIT_MS)
        assert "line 1: await add_line(product='espresso machine', unit_price_cents=15000)" in (
            await pending.inner_text())
        await screenshot(page, "ui-approval.png")
        await pending.locator("input").fill("checked the budget" if approve else "over budget")
        await pending.locator("button.approve" if approve else "button.deny").click()
        await page.wait_for_selector('#status[data-status="completed"]', timeout=_WAIT_MS)
        verdict = "approved by ana: checked the budget" if approve else "denied by ana: over budget"
        await page.locator("li.call", has_text=verdict).wait_for(timeout=_WAIT_MS)
        await page.wait_for_selector("#trace-section:not([hidden])", timeout=_WAIT_MS)
        await screenshot(page, "ui-run.png")
        output = await page.inner_text("li.final .answer")
        assert (output.startswith("Added line") if approve else output.startswith("Not added")), output
        assert "approved by ana" in await page.inner_text("#trace") if approve else True
        await page.close()
    result = await handle.result()
    assert [(r.approver, r.approved) for r in result.approvals] == [("ana", approve)]
    assert problems == []
    register_agents([agent])  # the approval rule is code: the replay looks it up
    await replay(handle)


HOSTILE_CODE = ("print('<script>window.pwned = 1</script>\\x1b[31m red \\u202e evil')\n"
                "await note(text='<img src=x onerror=\"window.pwned=2\">')")


async def test_a_hostile_run_runs_no_script_and_shows_its_text_escaped(
        client: Client, browser: Browser) -> None:
    model = scripted_model(RunCode(HOSTILE_CODE), lambda m: f"<b onmouseover=alert(1)>{last_result(m)}</b>")
    agent = Agent(model, name=f"hostile{os.urandom(3).hex()}")

    @agent.tool_plain
    def note(text: str) -> str:
        """Keep a note (a person approves each)."""
        return f"<svg onload=\"window.pwned=3\"></svg>{text}\u202e\x07"

    durable = CodeModeAgent(agent, tool_options={"note": ToolOptions(requires_approval=True)})
    tq = new_task_queue()
    async with running_worker(client, [durable], task_queue=tq, unsigned_approvals=True), \
            ui(client, UIAccess(approver="ana")) as url:
        handle = await start_run(client, durable, "Take a note", task_queue=tq, stream=True)
        page, problems = await open_page(browser, url.replace("/?", f"/run/{handle.id}?"))
        pending = page.locator("li.pending", has_text="call_0.0 note")
        await pending.wait_for(timeout=_WAIT_MS)
        await pending.locator("input").fill("<script>window.pwned=4</script>\u202e")
        await pending.locator("button.approve").click()
        await page.wait_for_selector('#status[data-status="completed"]', timeout=_WAIT_MS)
        await page.wait_for_selector("#trace-section:not([hidden])", timeout=_WAIT_MS)
        text = await page.inner_text("body")
        pwned: Any = await page.evaluate("window.pwned")
        injected = await page.locator("#tree script, #tree img, #tree svg, #tree b, #trace *").count()
        await page.close()
    assert pwned is None and injected == 0 and problems == []
    assert "<script>window.pwned = 1</script>\\x1b[31m red \\u202e evil" in text  # shown, escaped, not run
    assert '<img src=x onerror="window.pwned=2">' in text and "\u202e" not in text and "\x1b" not in text
    assert "approved by ana: <script>window.pwned=4</script>\\u202e" in text
    await handle.result()
    await replay(handle)


@pytest.mark.slow
async def test_bad_input_is_told_on_the_page_and_nothing_is_decided_twice(
        client: Client, browser: Browser, tmp_path: Path) -> None:
    agent = guarded(tmp_path)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True), \
            ui(client, UIAccess(approver="ana")) as url:
        handle = await start_run(client, agent, cart.GUARDED_PROMPT, task_queue=tq, stream=True)
        # A missing or wrong token: the page says where the right address comes from.
        stranger, _ = await open_page(browser, url.split("?")[0])
        assert "needs the address `codemode ui` printed" in await stranger.inner_text("#notice")
        wrong, _ = await open_page(browser, url.split("=")[0] + "=not-the-token-at-all")
        await wrong.wait_for_selector("#notice:not([hidden])", timeout=_WAIT_MS)
        assert "missing or wrong session token" in await wrong.inner_text("#notice")
        # Two tabs decide the same call: the second is told the run is closed, and nothing more happens. (The
        # second tab is kept from refreshing, so it still offers the call when its person clicks.)
        first, _ = await open_page(browser, url.replace("/?", f"/run/{handle.id}?"))
        second, _ = await open_page(browser, url.replace("/?", f"/run/{handle.id}?"))
        for tab in (first, second):
            await tab.locator("li.pending", has_text="call_0.0").wait_for(timeout=_WAIT_MS)
        held: list[Any] = []  # its refreshes are held unanswered (not failed: a failure would be told on the page)
        await second.route("**/pending", lambda route: held.append(route))
        await second.route("**/events*", lambda route: held.append(route))
        runs_page, _ = await open_page(browser, url)
        await first.locator("li.pending button.approve").click()
        await first.wait_for_selector('#status[data-status="completed"]', timeout=_WAIT_MS)
        await second.locator("li.pending button.deny").click()
        # The run ended with the first tab's approval: a closed run takes no decision, whoever sends it.
        told = second.locator("#notice", has_text="is closed")
        await told.wait_for(timeout=_WAIT_MS)
        assert "takes no decision" in await told.inner_text() and "nothing was decided" in await told.inner_text()
    # The server went away: the runs page says so (and keeps asking).
    await runs_page.wait_for_selector("#notice:not([hidden])", timeout=_WAIT_MS)
    assert "does not answer" in await runs_page.inner_text("#notice")
    result = await handle.result()
    assert [(r.approver, r.approved) for r in result.approvals] == [("ana", True)]
    register_agents([agent])
    await replay(handle)
