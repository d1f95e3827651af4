"""Signed approvals with the bundled command line: `codemode worker` / `codemode dev` take the approvers' keys.

The walk-through a newcomer follows: keys made, a worker given their public halves (flags or environment), the
guarded cart pausing its $150 add, an unsigned `codemode approve` refused, a signed one taking it, and
`codemode audit` reading the closed run's trail without replaying workflow code that needs the agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

from durable_codemode import start_run, wait_for_approvals
from durable_codemode.apps.activities.cart import CartStore
from durable_codemode.apps.workflows import cart
from durable_codemode.debugging import register_agents
from durable_codemode.testing import new_task_queue, replay

from .test_approval_authorization import KEYS
from .test_debugging import address, codemode
from .test_demo import _cli, _cli_env

STORES = ("CODEMODE_CART_DB", "CODEMODE_CALENDAR_DB", "CODEMODE_CHAT_DB", "CODEMODE_KANBAN_DB",
          "CODEMODE_INVENTORY_DB")
"""Where the bundled agents keep their stores: in the test's own folder, never the user's."""


def key_files(folder: Path) -> dict[str, Path]:
    """The private key files of ana and bob, and a public entries file for each (what `codemode keygen` prints)."""
    files: dict[str, Path] = {}
    for name in ("ana", "bob"):
        KEYS[name].save(folder / f"{name}.json")
        public = folder / f"{name}.pub.json"
        public.write_text(json.dumps({KEYS[name].key_id: KEYS[name].public_entry()}))
        files[name], files[f"{name}.pub"] = folder / f"{name}.json", public
    return files


@asynccontextmanager
async def serving(*args: str, folder: Path, **env: str) -> AsyncIterator[list[str]]:
    """`codemode ARGS` (a worker or a dev server) running until the block ends; the lines it printed so far."""
    stores = {name: str(folder / f"{name.lower()}.sqlite") for name in STORES}
    proc = await asyncio.create_subprocess_exec(
        *_cli(*args), env=_cli_env(**stores, **env), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, cwd=Path(__file__).parent.parent)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        while not any(line.startswith("worker: serving") for line in lines):
            line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
            assert line, f"codemode {' '.join(args)} ended before serving: {''.join(lines)}"
            lines.append(line)
        lines.append((await asyncio.wait_for(proc.stdout.readline(), timeout=10)).decode())  # the approvals line
        yield lines
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            rest, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
            lines.append(rest.decode())
    assert proc.returncode == 0, "".join(lines)


async def test_a_bundled_worker_given_keys_takes_only_signed_decisions(client: Client, tmp_path: Path) -> None:
    files = key_files(tmp_path)
    directory = tmp_path / "groups.json"
    directory.write_text(json.dumps({"finance": ["ana", "bob"]}))
    tq = new_task_queue()
    async with serving("worker", "--task-queue", tq, "--approver-keys", str(files["ana.pub"]), "--approver-keys",
                       str(files["bob.pub"]), "--approver-directory", str(directory), folder=tmp_path,
                       TEMPORAL_ADDRESS=address(client)) as lines:
        assert lines[-1].startswith(f"approvals: signed decisions only, by ana, bob (2 keys from {files['ana.pub']}")
        handle = await start_run(client, "cart-guarded", cart.GUARDED_PROMPT, task_queue=tq)
        (pending,) = await wait_for_approvals(client, handle.id, timeout=timedelta(seconds=60))
        rc, _, err = await codemode("approve", handle.id, pending.call_id, "--approver", "ana",
                                    address=address(client))
        assert rc == 1 and "not recorded: the decision is not signed" in err, err
        rc, out, err = await codemode("approve", handle.id, pending.call_id, "--key", str(files["ana"]),
                                      address=address(client))
        assert rc == 0 and f"approved {pending.call_id} add_line(" in out and "by ana" in out, err
        result = await handle.result()
    assert result.output.startswith("Added line") and [(r.approver, r.signed) for r in result.approvals] == [
        ("ana", True)]
    # The closed run's trail, from its history: no replay (which would need the agent's approval rule), no noise.
    rc, out, err = await codemode("audit", handle.id, address=address(client))
    assert rc == 0 and err == "", err
    (line,) = out.splitlines()
    assert f"{pending.call_id}" in line and f"approved by ana  signed with {KEYS['ana'].key_id}  via update" in line
    register_agents([cart.guarded_cart_agent(CartStore(tmp_path / "replay-cart.sqlite"))])
    await replay(handle)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_codemode_dev_reads_the_approvers_from_the_environment(tmp_path: Path) -> None:
    files = key_files(tmp_path)
    rc, _, err = await codemode("dev", "--db", str(tmp_path / "dev.sqlite"), "--approver-keys",
                                str(tmp_path / "missing.json"))
    assert rc == 2 and "cannot read the approver keys" in err and "missing.json" in err, err
    keys = os.pathsep.join(str(files[f"{n}.pub"]) for n in ("ana", "bob"))
    async with serving("dev", "--db", str(tmp_path / "dev.sqlite"), "--port", str(_free_port()), folder=tmp_path,
                       CODEMODE_APPROVER_KEYS=keys) as lines:
        assert lines[-1].startswith("approvals: signed decisions only, by ana, bob (2 keys from"), lines
    async with serving("dev", "--db", str(tmp_path / "dev.sqlite"), "--port", str(_free_port()),
                       folder=tmp_path) as lines:
        assert lines[-1].startswith("approvals: unsigned decisions accepted (local dev server)"), lines
        # codemode's page is served too, deciding unsigned as $USER (the dev server takes unsigned decisions).
        page = [line for line in lines if line.startswith("codemode's page (watch runs, decide approvals, as ")]
        assert len(page) == 1 and "http://127.0.0.1:" in page[0] and "/?token=" in page[0], lines
