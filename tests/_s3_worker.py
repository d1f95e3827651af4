"""The `report` agent of the S3 tests, and a worker process serving it with nothing but the environment's settings.

`python -m tests._s3_worker --address A --task-queue Q --identity ID` connects with `connect(A)`, so its payload store
is whatever `CODEMODE_PAYLOAD_STORE` names (an `s3://` URL in these tests, with the AWS settings beside it), serves
`report_agent()`, prints `ready <pid>` once it polls and stops gracefully on SIGTERM (releasing its sticky queue, so
another worker takes the run's next task at once).

The agent's program makes a 5 MB tool result, waits for a person to approve `publish`, then sends 3 MB of the report
back as a tool argument: each of those payloads is over Temporal's 2 MiB limit, so each lives in the store.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import sys

from pydantic_ai import Agent

from durable_codemode import CodeModeAgent, PoolSettings, ToolOptions, connect, create_worker
from durable_codemode.testing import RunCode, last_result, scripted_model

AGENT = "s3-report"
READY = "ready"

REPORT_BYTES = 5_000_000
"""The tool result: 5 MB of text."""
ARGUMENT_BYTES = 3_000_000
"""The part of it sent back as a tool argument."""

PROGRAM = f"""
report = await make_report(size={REPORT_BYTES})
sent = await publish(n=len(report))
digest = await fingerprint(text=report[:{ARGUMENT_BYTES}])
[len(report), report.count('7'), sent, digest]
"""


_PERIOD = "".join(str(i) for i in range(997))


def report_text(size: int) -> str:
    """What `make_report` returns: digits in a long period, so a shifted or truncated copy would not match."""
    return (_PERIOD * (size // len(_PERIOD) + 1))[:size]


def expected() -> list[object]:
    """The program's value."""
    report = report_text(REPORT_BYTES)
    return [REPORT_BYTES, report.count("7"), f"published {REPORT_BYTES}",
            hashlib.sha256(report[:ARGUMENT_BYTES].encode()).hexdigest()[:16]]


def report_agent(name: str = AGENT, *, tool_options: dict[str, ToolOptions] | None = None) -> CodeModeAgent:
    """`make_report(size)`, `publish(n)` (a person approves it) and `fingerprint(text)`, with a scripted model.

    `tool_options`: more tools' options, beside `publish`'s approval.
    """
    agent = Agent(scripted_model(RunCode(PROGRAM), lambda m: repr(last_result(m))), name=name,
                  instructions="Use run_code.")

    @agent.tool_plain
    def make_report(size: int) -> str:
        """A report of `size` characters."""
        return report_text(size)

    @agent.tool_plain
    def publish(n: int) -> str:
        """Publish the report of `n` characters (a person approves first)."""
        return f"published {n}"

    @agent.tool_plain
    def fingerprint(text: str) -> str:
        """A short SHA-256 of `text`."""
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    return CodeModeAgent(agent, tool_options={"publish": ToolOptions(requires_approval=True), **(tool_options or {})})


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests._s3_worker", description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--identity", required=True)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    client = await connect(args.address)  # CODEMODE_PAYLOAD_STORE and the AWS settings: the environment's
    worker = create_worker(client, [report_agent()], task_queue=args.task_queue, identity=args.identity,
                           pool=PoolSettings(max_processes=2), unsigned_approvals=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with worker:
        print(f"{READY} {os.getpid()} store={client.data_converter.external_storage}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(_arguments(argv)))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
