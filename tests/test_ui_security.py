"""`codemode ui`'s API refuses what a browser on another site, or a stranger, would send (`ui/_app.py`).

Over HTTP against the app itself (the browser tests drive the page): every refusal says why, and nothing is decided.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from durable_codemode import (
    CodeModeUserError,
    generate_approver_key,
    pending_approvals,
    start_run,
    wait_for_approvals,
)
from durable_codemode.apps.activities.cart import CartStore
from durable_codemode.apps.workflows import cart
from durable_codemode.debugging import register_agents
from durable_codemode.testing import new_task_queue, replay, running_worker
from durable_codemode.ui import UIAccess, serve_ui, ui_app

TOKEN = "a-session-token-long-enough"
HOST = "127.0.0.1:8181"


def http(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{HOST}")  # type: ignore[arg-type]


async def test_the_api_refuses_strangers_other_sites_and_other_hosts(client: Client, tmp_path: Path) -> None:
    store = CartStore(tmp_path / "cart.sqlite")
    store.seed(lines=3)
    agent = cart.guarded_cart_agent(store)
    tq = new_task_queue()
    app = ui_app(client, token=TOKEN, access=UIAccess(approver="ana"), hosts=(HOST,))
    read_only = ui_app(client, token=TOKEN, hosts=(HOST,))
    async with running_worker(client, [agent], task_queue=tq, unsigned_approvals=True):
        handle = await start_run(client, agent, cart.GUARDED_PROMPT, task_queue=tq)
        await wait_for_approvals(client, handle.id)
        decision = {"call_id": "call_0.0", "approved": True, "note": None}
        path = f"/api/runs/{handle.id}/decisions"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with http(app) as api:
            refused = [
                await api.get("/api/runs"),  # no token
                await api.get("/api/runs", headers={"Authorization": "Bearer wrong-token-of-same-size-x"}),
                await api.post(path, json=decision, headers={**auth, "Origin": "https://evil.example"}),
                await api.post(path, content="call_id=call_0.0", headers={**auth, "Origin": f"http://{HOST}",
                                                                        "Content-Type": "text/plain"}),
                await api.get("/api/runs", headers={**auth, "Host": "attacker.example:8181"}),
            ]
            assert [r.status_code for r in refused] == [401, 401, 403, 415, 421]
            assert "missing or wrong session token" in refused[0].json()["error"]
            assert "must come from this page" in refused[2].json()["error"]
            assert (await api.get("/api/runs", headers=auth)).status_code == 200
        async with http(read_only) as api:
            answer = await api.post(path, json=decision, headers={**auth, "Origin": f"http://{HOST}"})
            assert answer.status_code == 403 and "this page is read-only" in answer.json()["error"]
        assert len(await pending_approvals(client, handle.id)) == 1, "nothing was decided"
        async with http(app) as api:
            decided = await api.post(path, json=decision, headers={**auth, "Origin": f"http://{HOST}"})
            assert decided.status_code == 200 and decided.json()["approver"] == "ana"
            again = await api.post(path, json={**decision, "approved": False}, headers=auth)
            assert again.status_code == 409 and "did not record this decision" in again.json()["error"]
            unknown = await api.get("/api/runs/no-such-run/pending", headers=auth)
            assert unknown.status_code == 404
        result = await handle.result()
    assert [(r.approver, r.approved) for r in result.approvals] == [("ana", True)]
    register_agents([agent])
    await replay(handle)


async def test_the_page_binds_to_loopback_unless_told(client: Client) -> None:
    with pytest.raises(CodeModeUserError, match="binds to loopback only"):
        await serve_ui(client, host="0.0.0.0", port=0)
    with pytest.raises(CodeModeUserError, match="at least 16 characters"):
        ui_app(client, token="short")


async def test_a_page_with_an_approvers_key_signs_its_decisions(client: Client, tmp_path: Path) -> None:
    """`codemode ui --key FILE`: the worker checks the page's decision against the approver's public key."""
    store = CartStore(tmp_path / "cart.sqlite")
    store.seed(lines=3)
    agent = cart.guarded_cart_agent(store)
    tq = new_task_queue()
    ana = generate_approver_key("ana")
    unsigned_page = ui_app(client, token=TOKEN, access=UIAccess(approver="ana"), hosts=(HOST,))
    signed_page = ui_app(client, token=TOKEN, access=UIAccess(signer=ana), hosts=(HOST,))
    async with running_worker(client, [agent], task_queue=tq, approver_keys={ana.key_id: ana.public_entry()}):
        handle = await start_run(client, agent, cart.GUARDED_PROMPT, task_queue=tq)
        await wait_for_approvals(client, handle.id)
        decision = {"call_id": "call_0.0", "approved": True, "note": "checked"}
        path = f"/api/runs/{handle.id}/decisions"
        headers = {"Authorization": f"Bearer {TOKEN}", "Origin": f"http://{HOST}"}
        async with http(unsigned_page) as api:
            refused = await api.post(path, json=decision, headers=headers)
        assert refused.status_code == 409 and "the decision is not signed" in refused.json()["error"], refused.text
        assert len(await pending_approvals(client, handle.id)) == 1, "an unsigned decision decided nothing"
        async with http(signed_page) as api:
            decided = await api.post(path, json=decision, headers=headers)
        assert decided.status_code == 200, decided.text
        result = await handle.result()
    assert [(r.approver, r.approved, r.signed, r.key_id) for r in result.approvals] == [
        ("ana", True, True, ana.key_id)]
    register_agents([agent])
    await replay(handle)
