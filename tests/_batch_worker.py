"""A worker process for the batch kill test: `python -m tests._batch_worker --address A --task-queue Q --dir D`.

It serves the `batch-reads` agent, whose one tool `read(key, hold)` is batched. Every attempt of a call appends
`<idempotency key> <pid>` to `D/attempts.log`; a call with `hold=True` then waits until the file `D/gate` exists.
So a test can let the quick calls of a batch finish, kill the worker while the held ones still run, open the gate,
start another worker, and count how often each call ran. Prints `ready <pid>` once it polls; runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

from pydantic_ai import Agent

from durable_codemode import CodeModeAgent, ToolOptions, connect, create_worker, current_call
from durable_codemode.testing import RunCode, last_result, scripted_model

AGENT = "batch-reads"
HELD_FROM = 3
"""Calls `k<HELD_FROM>` and after hold until the gate opens; the ones before return at once."""
CALLS = 6
PROGRAM = (f"import asyncio\nawait asyncio.gather(*(read(key=f'k{{i}}', hold=i >= {HELD_FROM}) "
           f"for i in range({CALLS})))")
HEARTBEAT = timedelta(seconds=2)


def batch_reads_agent(folder: Path) -> CodeModeAgent:
    """The agent: its scripted model runs `PROGRAM`, then answers with its result as JSON."""
    agent = Agent(scripted_model(RunCode(PROGRAM), lambda m: json.dumps(last_result(m)["result"])), name=AGENT,
                  instructions="Use run_code.")

    @agent.tool_plain
    async def read(key: str, hold: bool = False) -> str:
        """Read `key` (its name in capitals); with `hold`, only once the gate is open."""
        with (folder / "attempts.log").open("a") as log:
            log.write(f"{current_call().idempotency_key} {os.getpid()}\n")
        while hold and not (folder / "gate").exists():
            await asyncio.sleep(0.05)
        return key.upper()

    return CodeModeAgent(agent, tool_options={"read": ToolOptions(batch=True, heartbeat_timeout=HEARTBEAT)})


async def serve(args: argparse.Namespace) -> None:
    """Serve the agent until SIGTERM (or a kill)."""
    client = await connect(args.address)
    worker = create_worker(client, [batch_reads_agent(Path(args.dir))], task_queue=args.task_queue,
                           identity=f"batch-{os.getpid()}",
                           sticky_queue_schedule_to_start_timeout=timedelta(seconds=1))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with worker:
        print(f"ready {os.getpid()}", flush=True)
        await stop.wait()


def main() -> None:
    """Run the worker; leave with `os._exit` (a Temporal client can abort at interpreter exit)."""
    parser = argparse.ArgumentParser(prog="python -m tests._batch_worker", description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--dir", required=True)
    asyncio.run(serve(parser.parse_args()))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
