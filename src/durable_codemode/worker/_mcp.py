"""MCP servers on a worker: their tools as the program receives them, and one connection per server for its lifetime.

pydantic-ai's `MCPToolset` connects when it is entered and disconnects when the last user leaves. Left alone, a
worker would start a stdio server for every tool call (each call enters and leaves it), and a server that died
would stay dead for as long as anything held the toolset. So the worker enters every MCP toolset of its agents
once, when it starts (`McpServers.serving`), and one supervisor task per toolset holds it; a call that finds the
connection lost asks that task to reconnect and fails as a transient error, which the tool's retry policy retries.
Entering and leaving always happen in the supervisor's own task (what anyio's cancel scopes require), and leaving
the worker leaves every toolset, so no server process outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset

from ..shared._errors import TransientToolError

CONNECTION_CLOSED = -32000
"""`mcp.types.CONNECTION_CLOSED`: the JSON-RPC error code of a lost connection."""


def _mcp_toolset_class() -> type | None:
    """pydantic-ai's `MCPToolset`, if anything in this process imported it; never imported here.

    An agent with an MCP toolset imported `pydantic_ai.mcp` to build it. Importing it for every worker (the `mcp`
    SDK, fastmcp's client) cost ~1 s of start-up and ~40 MB of RSS per process, for workers without MCP too.
    """
    module = sys.modules.get("pydantic_ai.mcp")
    return getattr(module, "MCPToolset", None)


__all__ = ["McpServers", "as_received", "connection_lost", "mcp_toolsets", "reconnect_lost"]

logger = logging.getLogger(__name__)

_RECONNECT_WAIT_SECONDS = 10.0
"""How long a reconnect waits for calls still on the lost connection to leave it before reconnecting anyway
(they fail at once on a closed connection, so this is a backstop, not a delay anyone sees)."""


def mcp_toolsets(toolsets: Sequence[AbstractToolset[Any]]) -> list[Any]:
    """The `MCPToolset`s in `toolsets`, also inside wrappers (`prefixed`, `filtered`, combined), each once."""
    found: list[Any] = []
    toolset_class = _mcp_toolset_class()
    if toolset_class is None:
        return found

    def visit(toolset: AbstractToolset[Any]) -> None:
        if isinstance(toolset, toolset_class) and all(t is not toolset for t in found):
            found.append(toolset)

    for toolset in toolsets:
        toolset.apply(visit)
    return found


def as_received(tool: ToolDefinition) -> ToolDefinition:
    """An MCP tool's definition with the return schema of the value a call returns, not of the server's envelope.

    An MCP server sends a tool's primitive or list result inside `{"result": ...}`, and its output schema
    describes that envelope (fastmcp marks it `x-fastmcp-wrap-result`); pydantic-ai unwraps every structured
    result whose only key is `result`. Stubs rendered from the envelope made `stock(sku: str) -> int` return a
    `StockReturn` TypedDict, so `sum(await asyncio.gather(...))` was refused by the type checker while the program
    got ints. The same rule as pydantic-ai's (`_map_mcp_call_tool_result`), applied to the schema.
    """
    schema = tool.return_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return tool
    properties = schema.get("properties")
    if not isinstance(properties, dict) or set(properties) != {"result"} or "result" not in schema.get(
            "required", ()):
        return tool
    inner = dict(properties["result"])
    if "$defs" in schema:  # the result's own references point at the envelope's definitions
        inner.setdefault("$defs", schema["$defs"])
    return replace(tool, return_schema=inner)


def schema_digest(tool: ToolDefinition) -> str:
    """A short digest of what a program's call of `tool` relies on: its argument schema and its result schema.

    Recorded per MCP tool when a run starts and checked at each call: a server that now describes the tool
    differently (renamed or retyped arguments, another result) would otherwise take or return what the run's
    programs were not type-checked against. Descriptions are left out: a reworded docstring changes no call.
    """
    schemas = json.dumps([tool.parameters_json_schema, tool.return_schema], sort_keys=True, default=str)
    return hashlib.sha256(schemas.encode()).hexdigest()[:16]


def connection_lost(error: BaseException) -> bool:
    """Whether `error` says the connection to an MCP server is gone (not that a tool failed)."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if getattr(e, "code", None) == CONNECTION_CLOSED or isinstance(
                e, (ConnectionError, EOFError, BrokenPipeError)) or type(e).__name__ in (
                "ClosedResourceError", "BrokenResourceError", "EndOfStream", "ConnectError", "RemoteProtocolError"):
            return True
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        stack.extend([e.__cause__, e.__context__])
    return False


class _Held:
    """One MCP toolset, held entered by its own task for the worker's lifetime and re-entered when lost."""

    def __init__(self, toolset: Any) -> None:
        self.toolset = toolset
        self.reconnect = asyncio.Event()
        self.stop = asyncio.Event()
        self.entered = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def hold(self) -> None:
        while not self.stop.is_set():
            try:
                await self.toolset.__aenter__()
            except Exception as e:
                logger.warning("MCP server %s could not be started: %s: %s; retried at the next call",
                               self.toolset.label, type(e).__name__, e)
                self.entered.set()
                await self._wait_for(self.reconnect)
                self.reconnect.clear()
                continue
            self.entered.set()
            try:
                await self._wait_for(self.reconnect)
            finally:
                self.reconnect.clear()
                await self._leave()

    async def _wait_for(self, event: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _leave(self) -> None:
        with contextlib.suppress(Exception):
            await self.toolset.__aexit__(None, None, None)
        # fastmcp's stdio transport keeps its server process alive after the session closes (`keep_alive`, on by
        # default): close the transport too, or the process outlives the worker.
        close = getattr(getattr(self.toolset.client, "transport", None), "close", None)
        if close is not None and not self.toolset.is_running:
            with contextlib.suppress(Exception):
                await close()
        # Calls still on the lost connection hold it open; it closes (and the next enter reconnects) when
        # they leave, which they do at once on a closed connection.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _RECONNECT_WAIT_SECONDS
        while self.toolset.is_running and loop.time() < deadline and not self.stop.is_set():
            await asyncio.sleep(0.05)


_HELD: dict[int, _Held] = {}
"""The toolsets held by the running workers of this process, by `id()` (toolsets are not hashable)."""


class McpServers:
    """The MCP toolsets of a worker's agents: started with the worker, reconnected when lost, left on shutdown."""

    def __init__(self, agents: Sequence[Agent[Any, Any]]) -> None:
        self._toolsets = mcp_toolsets([t for agent in agents for t in agent.toolsets])

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Hold every toolset entered while the worker runs (a toolset already held by another worker is shared)."""
        mine = [_Held(t) for t in self._toolsets if id(t) not in _HELD]
        for held in mine:
            _HELD[id(held.toolset)] = held
            held.task = asyncio.create_task(held.hold(), name=f"mcp server {held.toolset.label}")
        try:
            await asyncio.gather(*(held.entered.wait() for held in mine))
            yield
        finally:
            for held in mine:
                held.stop.set()
            await asyncio.gather(*(held.task for held in mine if held.task is not None), return_exceptions=True)
            for held in mine:
                _HELD.pop(id(held.toolset), None)


def reconnect_lost(toolsets: Sequence[AbstractToolset[Any]], error: BaseException, *, subject: str) -> None:
    """Raise a transient error if `error` is a lost connection to an MCP server in `toolsets`; ask for a reconnect.

    Raises:
        TransientToolError: the connection to one of the MCP servers is lost (the server died, or its HTTP
            endpoint is unreachable); the call is retried by the tool's retry policy, on a new connection.

    """
    servers = mcp_toolsets(toolsets)
    if not servers or not connection_lost(error):
        return
    for server in servers:
        held = _HELD.get(id(server))
        if held is not None:
            held.reconnect.set()
    raise TransientToolError(
        f"{subject}: the connection to MCP server {servers[0].label} was lost ({type(error).__name__}: {error}); "
        "the worker reconnects and the call is retried") from error
