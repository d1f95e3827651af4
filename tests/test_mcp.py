"""MCP servers as users have them: pydantic-ai's `MCPToolset` over stdio and streamable HTTP, under a durable run.

Real fastmcp servers (`tests/_mcp_server.py`) in their own processes, a real Temporal dev server and real Monty;
only the model is scripted. Every completed run's history is replayed offline, with no server running.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent, BinaryImage
from pydantic_ai.mcp import MCPToolset, load_mcp_toolsets
from pydantic_ai.messages import ModelRequest, ToolReturnPart
from temporalio.client import Client
from temporalio.common import RetryPolicy

from durable_codemode import CodeModeAgent, ToolOptions, start_run
from durable_codemode.testing import (
    CallTool,
    RunCode,
    last_result,
    new_task_queue,
    replay,
    running_worker,
    scripted_model,
)
from durable_codemode.worker._describe import describe_run

from ._mcp_server import PNG

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

SERVER = str(Path(__file__).with_name("_mcp_server.py"))
_QUIET = {"FASTMCP_LOG_LEVEL": "ERROR"}
SERVER_START_SECONDS = 120
"""How long the test server may take to start and answer `initialize` (pydantic-ai's default is 5 s): it imports
fastmcp first, ~3 s of CPU, and under two CPU burners beside the suite that took longer than 5 s."""


def stdio_toolset(state: Path | None = None) -> MCPToolset[Any]:
    args = [SERVER, *(["--state", str(state)] if state else [])]
    return MCPToolset(StdioTransport(command=sys.executable, args=args, env=dict(os.environ, **_QUIET)),
                      id="inventory", init_timeout=SERVER_START_SECONDS)


def mcp_agent(name: str, toolset: MCPToolset[Any], *steps: Any, **options: Any) -> CodeModeAgent:
    return CodeModeAgent(Agent(scripted_model(*steps), name=name, toolsets=[toolset]), **options)


def _answer(messages: Any) -> str:
    return json.dumps(last_result(messages))


def _snippets(result: Any) -> list[Any]:
    return [s for t in result.turns for s in t.snippets]


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # pid (comm) state ppid: comm may hold spaces


def _descends_from_us(pid: int) -> bool:
    while pid > 1:
        pid = _parent(pid)
        if pid == os.getpid():
            return True
    return False


def _server_pids() -> list[int]:
    """The pids of the test MCP servers running now that this test process started (directly or not).

    Other test processes run their own servers at the same time (the suite runs in several): theirs are not ours.
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if SERVER.encode() in cmdline and _descends_from_us(int(entry.name)):
                pids.append(int(entry.name))
    return pids


GATHERED = """\
import asyncio
counts = await asyncio.gather(stock(sku='a'), stock(sku='b'), stock(sku='c'))
item_c = await item(sku='c')
total: int = sum(counts) + item_c['qty']
names = await skus()
{"counts": counts, "total": total, "first": names[0].upper(), "double": [n * 2 for n in counts]}
"""


async def test_stdio_tools_type_check_as_the_values_they_return(client: Client) -> None:
    # The program: `sum` over gathered int results, refused before as no-matching-overload.
    agent = mcp_agent("mcp-stdio", stdio_toolset(), RunCode(GATHERED), _answer)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-stdio", "go", task_queue=tq)
        result = await handle.result()
    snippet = _snippets(result)[0]
    assert snippet.outcome == "ok", snippet.result
    assert json.loads(result.output)["result"] == {"counts": [7, 14, 21], "total": 63, "first": "A",
                                                   "double": [14, 28, 42]}
    await replay(handle)


async def test_stubs_describe_unwrapped_results_and_a_wrong_use_is_refused(client: Client) -> None:
    wrong = "n = await stock(sku='a')\nn['result']"
    agent = mcp_agent("mcp-stubs", stdio_toolset(), RunCode(wrong), _answer)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-stubs", "go", task_queue=tq)
        result = await handle.result()
    snippet = _snippets(result)[0]
    assert snippet.outcome == "rejected" and "int" in snippet.result
    await replay(handle)


async def test_text_and_image_content_reach_the_program_as_documented(client: Client) -> None:
    # No output schema says what these return, so their stubs are `-> Any`; the program gets pydantic-ai's own
    # values: a list of the text contents' strings, and the image as a dict with its base64 data and media type.
    code = ("import base64\np = await photo(sku='a')\nl = await label(sku='b')\n"
            "{'media': p['media_type'], 'data': list(base64.b64decode(p['data'])), 'label': ' / '.join(l)}")
    agent = mcp_agent("mcp-content", stdio_toolset(), RunCode(code), _answer)
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        spec_stubs = (await describe_run(agent)).stubs
        handle = await start_run(client, "mcp-content", "go", task_queue=tq)
        result = await handle.result()
    assert "async def photo(*, sku: str) -> Any:" in spec_stubs and "async def label(*, sku: str) -> Any:" in spec_stubs
    assert json.loads(result.output)["result"] == {"media": "image/png", "data": list(PNG),
                                                   "label": "SKU b / qty 14"}
    await replay(handle)


async def test_native_image_content_reaches_the_model_as_an_image(client: Client) -> None:
    # As under `agent.run()`: the tool return the model reads is pydantic-ai's `BinaryImage`, not its JSON form.
    returned: list[Any] = []

    def look(messages: Any) -> str:
        returned.extend(p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
                        if isinstance(p, ToolReturnPart))
        return "seen"

    agent = mcp_agent("mcp-native-image", stdio_toolset(), CallTool("photo", {"sku": "a"}), look, sandbox_tools=[])
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-native-image", "go", task_queue=tq)
        assert (await handle.result()).output == "seen"
    assert len(returned) == 1 and isinstance(returned[0], BinaryImage), returned
    assert returned[0].data == PNG and returned[0].media_type == "image/png"
    await replay(handle)


async def test_native_mcp_tools_and_catchable_errors(client: Client) -> None:
    code = ("try:\n    await reserve(sku='nope')\n    caught = None\nexcept Exception as e:\n    caught = str(e)\n"
            "[await reserve(sku='a'), caught]")
    agent = mcp_agent("mcp-native", stdio_toolset(), CallTool("item", {"sku": "b"}), RunCode(code), _answer,
                      sandbox_tools=["reserve"])
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-native", "go", task_queue=tq)
        result = await handle.result()
    direct = [c for t in result.turns for c in t.direct_calls]
    assert [c.tool for c in direct] == ["item"] and json.loads(direct[0].result) == {"sku": "b", "qty": 14}
    reserved, caught = json.loads(result.output)["result"]
    assert reserved == "reserved a"
    assert caught is not None and "unknown sku 'nope'" in caught
    await replay(handle)


async def test_one_stdio_server_per_worker_stopped_with_it(client: Client) -> None:
    code = "import asyncio\nawait asyncio.gather(*(server_pid() for _ in range(4)))"
    agent = mcp_agent("mcp-once", stdio_toolset(), RunCode(code), RunCode("await server_pid()"), _answer)
    tq = new_task_queue()
    before = set(_server_pids())
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-once", "go", task_queue=tq)
        result = await handle.result()
        running = set(_server_pids()) - before
    pids = json.loads(_snippets(result)[0].result)["result"]
    assert len(set(pids)) == 1 and json.loads(result.output)["result"] == pids[0]
    assert running == {pids[0]}
    # The worker's shutdown stopped it: its exit is asynchronous, so wait for it (bounded) rather than look once.
    deadline = time.monotonic() + 30
    while pids[0] in _server_pids():
        assert time.monotonic() < deadline, f"the MCP server {pids[0]} outlived its worker by 30 s"
        await asyncio.sleep(0.05)
    await replay(handle)


async def test_a_server_killed_mid_call_is_restarted_and_the_call_retried(client: Client, tmp_path: Path) -> None:
    (tmp_path / "crash-next").touch()
    code = "before = await server_pid()\nr = await reserve(sku='a')\n[before, r, await server_pid()]"
    agent = mcp_agent("mcp-crash", stdio_toolset(tmp_path), RunCode(code), _answer,
                      tool_options={"reserve": ToolOptions(retry_policy=_retry(3))})
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-crash", "go", task_queue=tq)
        result = await handle.result()
    before, reserved, after = json.loads(result.output)["result"]
    assert reserved == "reserved a"
    assert before != after  # a new server answered the retry
    assert not (tmp_path / "crash-next").exists()  # the first attempt did reach the server, which died in it
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
              and e.activity_task_scheduled_event_attributes.activity_type.name == "mcp-crash.reserve"]
    assert len(failed) == 1  # one activity, retried within it (attempts are not new events)
    await replay(handle)


async def _run_across_a_server_change(client: Client, tmp_path: Path, name: str, variant: str,
                                      second: str) -> Any:
    """A run whose first program calls `stock`, after which the server restarts as `variant` for the second.

    `reserve` kills the server mid-call (`crash-next`), so the second program's `stock` call reaches a server that
    started as the new version; the run's first program proves it recorded the old `stock`.
    """
    (tmp_path / "crash-next").touch()
    before = "try:\n    await reserve(sku='a')\nexcept Exception as e:\n    pass\n"

    def flip(messages: Any) -> RunCode:
        (tmp_path / "variant").write_text(variant)
        return RunCode(before + second)

    agent = mcp_agent(name, stdio_toolset(tmp_path), RunCode("await stock(sku='a')"), flip, _answer,
                      tool_options={"reserve": ToolOptions(retry_policy=_retry(2))})
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, name, "go", task_queue=tq)
        result = await handle.result()
    assert json.loads(_snippets(result)[0].result)["result"] == 7
    await replay(handle)
    return result


async def test_a_tool_gone_since_the_run_started_is_a_clear_error(client: Client, tmp_path: Path) -> None:
    # The run records `stock`; the server then restarts as a version that renamed it.
    result = await _run_across_a_server_change(
        client, tmp_path, "mcp-drift", "v2",
        "try:\n    r = await stock(sku='a')\nexcept KeyError as e:\n    r = str(e)\nr")
    message = json.loads(result.output)["result"]
    assert "has no tool 'stock' now" in message and "stock_level" in message


async def test_a_tool_whose_schema_changed_since_the_run_started_is_refused(client: Client, tmp_path: Path) -> None:
    # The run records `stock(sku) -> int`; the server restarts as a version whose `stock` returns text. The
    # program was type-checked against `-> int`, so the call is refused, catchably, and never reaches the server.
    result = await _run_across_a_server_change(
        client, tmp_path, "mcp-retyped", "v3",
        "try:\n    r = str(await stock(sku='a'))\nexcept TypeError as e:\n    r = str(e)\nr")
    message = json.loads(result.output)["result"]
    assert "MCP tool 'stock' of agent 'mcp-retyped' changed since the run started" in message, message
    assert "the call was not made" in message
    calls = [c for s in _snippets(result) for c in s.calls if c.tool == "stock"]
    assert [c.status for c in calls] == ["ok", "error"], calls


def _retry(attempts: int) -> RetryPolicy:
    return RetryPolicy(maximum_attempts=attempts, initial_interval=timedelta(milliseconds=100))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, SERVER, "--http", str(port),
                                                env=dict(os.environ, **_QUIET))
    try:
        for _ in range(200):  # until it accepts connections (it takes about a second to import and bind)
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        await proc.wait()


async def test_streamable_http_server(client: Client, http_server: str) -> None:
    toolset: MCPToolset[Any] = MCPToolset(http_server, id="inventory", init_timeout=SERVER_START_SECONDS)
    agent = mcp_agent("mcp-http", toolset, RunCode(GATHERED),
                      CallTool("item", {"sku": "a"}), _answer, sandbox_tools=["stock", "skus", "item"])
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-http", "go", task_queue=tq)
        result = await handle.result()
    assert json.loads(_snippets(result)[0].result)["result"]["total"] == 63
    await replay(handle)


def test_a_worker_without_mcp_toolsets_does_not_load_the_mcp_client() -> None:
    # The MCP SDK and fastmcp's client are ~40 MB of RSS and ~1 s of start-up: only agents that use them pay.
    code = ("import sys, durable_codemode, durable_codemode.worker; "
            "print(sorted(m for m in ('mcp', 'fastmcp', 'pydantic_ai.mcp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out


async def test_servers_from_an_mcp_config_file(client: Client, http_server: str, tmp_path: Path) -> None:
    # pydantic-ai's `load_mcp_toolsets`: the `mcpServers` shape of Claude Desktop and Cursor, a stdio server and an
    # HTTP one, each prefixed with its name, both in one program.
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "local": {"command": sys.executable, "args": [SERVER], "env": _QUIET},
        "remote": {"url": http_server},
    }}))
    program = ("import asyncio\n"
               "a, b = await asyncio.gather(local_stock(sku='a'), remote_stock(sku='b'))\n"
               "a + b")
    agent = CodeModeAgent(Agent(scripted_model(RunCode(program), _answer), name="mcp-config",
                                toolsets=load_mcp_toolsets(config)))
    tq = new_task_queue()
    async with running_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, "mcp-config", "go", task_queue=tq)
        result = await handle.result()
    assert json.loads(result.output)["result"] == 7 + 14
    assert sorted(c.tool for c in result.nested_calls) == ["local_stock", "remote_stock"]
    await replay(handle)
