"""The `ops` agent before and after a deploy, and a worker process that serves one of them as a deployment version.

`python -m tests._deploy_agents --address A --task-queue Q --code old|new --deployment NAME --build-id ID --ledger F`
serves the agent's `old` or `new` code as version NAME:ID of a Temporal Worker Deployment; it prints `ready <pid>`
once it polls, and stops on SIGTERM (letting its tool calls finish). Every tool call is written to a SQLite ledger
with the worker's pid, so a test sees which version ran what.

The deploy changes three things a paused run recorded:
- `transfer(order, cents)` becomes `transfer(order, amount_cents)` (a parameter renamed), and its approval rule's
  threshold goes from 10,000 to 50,000 cents;
- `notify(to, text)` is gone;
- the output `Receipt {total}` becomes `ReceiptV2 {total_cents}` (a field renamed).

The model is scripted: turn 0 writes the program for the tools the run offers (read from the `run_code` stubs),
turn 1 answers with the output tool it is offered, filling its one field with the number of transfers.
`tests._deploy_old` and `tests._deploy_new` give each code's `agents()`, for `codemode check-deploy --worker`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from durable_codemode import CodeModeAgent, PoolSettings, ToolOptions, connect, create_worker, current_call
from durable_codemode.testing import last_result

AGENT = "ops"
READY = "ready"

Code = Literal["old", "new"]

OLD_PROGRAM = """
a = await transfer(order='S', cents=500)
b = await transfer(order='L', cents=50_000)
n = await notify(to='ops', text='paid')
[a, b, n]
"""

NEW_PROGRAM = """
a = await transfer(order='S', amount_cents=500)
b = await transfer(order='XL', amount_cents=90_000)
[a, b]
"""


class Receipt(BaseModel):
    total: int


class ReceiptV2(BaseModel):
    total_cents: int


def _model() -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            stubs = next(t.description or "" for t in info.function_tools if t.name == "run_code")
            program = NEW_PROGRAM if "amount_cents" in stubs else OLD_PROGRAM
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": program}, tool_call_id="call_0")])
        tool = info.output_tools[0]
        field = next(iter(tool.parameters_json_schema["properties"]))
        done = len(last_result(messages)["result"])
        return ModelResponse(parts=[ToolCallPart(tool.name, {field: done}, tool_call_id="out_1")])

    return FunctionModel(respond, model_name="scripted-ops")


def _record(ledger: Path | None, tool: str) -> None:
    if ledger is None:
        return
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT, tool TEXT, pid INTEGER)")
        db.execute("INSERT INTO calls VALUES (?, ?, ?)", (current_call().idempotency_key, tool, os.getpid()))


def calls(ledger: Path) -> list[tuple[str, str, int]]:
    """Every tool call the workers made: (idempotency key, tool, worker pid), in order."""
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT, tool TEXT, pid INTEGER)")
        return [tuple(r) for r in db.execute("SELECT key, tool, pid FROM calls ORDER BY rowid")]


def _old_tools(agent: Agent[None, Any], ledger: Path | None) -> ToolOptions:
    @agent.tool_plain
    def transfer(order: str, cents: int) -> str:
        """Move `cents` for `order`."""
        _record(ledger, "transfer")
        return f"moved {cents} for {order}"

    @agent.tool_plain
    def notify(to: str, text: str) -> str:
        """Tell `to` that `text`."""
        _record(ledger, "notify")
        return f"told {to}"

    return ToolOptions(approval_rule=lambda args: args["cents"] > 10_000)


def _new_tools(agent: Agent[None, Any], ledger: Path | None) -> ToolOptions:
    @agent.tool_plain
    def transfer(order: str, amount_cents: int) -> str:
        """Move `amount_cents` for `order`."""
        _record(ledger, "transfer")
        return f"moved {amount_cents} for {order}"

    return ToolOptions(approval_rule=lambda args: args["amount_cents"] > 50_000)


def ops_agent(code: Code, ledger: Path | None = None) -> CodeModeAgent:
    """The `ops` agent as the `old` or the `new` code has it."""
    agent: Agent[None, Any] = Agent(_model(), name=AGENT, output_type=Receipt if code == "old" else ReceiptV2)
    rule = _old_tools(agent, ledger) if code == "old" else _new_tools(agent, ledger)
    return CodeModeAgent(agent, tool_options={"transfer": rule})


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests._deploy_agents", description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--code", choices=["old", "new"], required=True)
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--build-id", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--identity", required=True)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    client = await connect(args.address)
    worker = create_worker(client, [ops_agent(args.code, Path(args.ledger))], task_queue=args.task_queue,
                           deployment=f"{args.deployment}:{args.build_id}", identity=args.identity,
                           pool=PoolSettings(max_processes=2), unsigned_approvals=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with worker:
        print(f"{READY} {os.getpid()}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(_arguments(argv)))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

