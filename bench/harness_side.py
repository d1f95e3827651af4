"""The pydantic-ai-harness side of `bench/harness_bench.py`, as a subprocess in the harness's own Python.

`bench/harness_bench.py` starts this script with an interpreter that has `pydantic-ai-harness[codemode,temporal]`
(pydantic-ai-harness 0.62 pins `pydantic-ai-slim==2.62.0`, durable-codemode needs `>=2.68`, so the two cannot
share a venv). It connects to the benchmark's dev server, runs a worker for `HarnessWorkflow`, and then serves
one JSON request per stdin line, answering one JSON line each on stdout:

- `{"code": ..., "n": N}` -> `{"wall_s", "replay_s", "events", "history_proto_bytes", "history_json_chars",
  "output", "nested_calls"}`, or `{"error": traceback}`;
- end of input -> the worker shuts down and the process exits.

Its first line is `{"ready": true, "versions": {...}}` once the worker polls. Anything else that writes to
stdout (a library's warning, a print) is sent to stderr, so the protocol stays parseable.

The worker and the replayer are what the harness's docs prescribe: the client and both carry
`PydanticAIPlugin()`, the worker registers the agent's activities with `AgentPlugin(AGENT)`, and the workflow
runner is Temporal's default sandboxed one, which the plugin configures (`--runner unsandboxed` runs it
without the sandbox instead, in the worker and the replayer, to show what the sandbox costs it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.harness_workflow` must be importable

from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
from temporalio.api.history.v1 import History
from temporalio.client import Client
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from bench.harness_workflow import AGENT, HarnessInput, HarnessWorkflow


def versions() -> dict[str, str]:
    """The harness side's own package versions, for the benchmark's machine line."""
    out: dict[str, str] = {}
    for dist in ("pydantic-ai-harness", "pydantic-ai-slim", "temporalio", "pydantic-monty"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


async def measure(client: Client, replayer: Replayer, task_queue: str, request: dict[str, Any]) -> dict[str, Any]:
    """One run, timed from `start_workflow` to `result()` as the other sides are, then its offline replay."""
    start = time.perf_counter()
    handle = await client.start_workflow(HarnessWorkflow.run, HarnessInput(code=request["code"]),
                                         id=f"bench-harness-{uuid.uuid4().hex[:8]}", task_queue=task_queue)
    result = await handle.result()
    wall = time.perf_counter() - start
    history = await handle.fetch_history()
    start = time.perf_counter()
    replay = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    replay_s = time.perf_counter() - start
    if replay.replay_failure is not None:
        raise RuntimeError(f"the harness's history did not replay: {replay.replay_failure!r}")
    return {
        "wall_s": wall, "replay_s": replay_s, "events": len(history.events),
        "history_proto_bytes": History(events=list(history.events)).ByteSize(),
        "history_json_chars": len(history.to_json()), "output": result.output, "nested_calls": result.nested_calls,
    }


async def serve(args: argparse.Namespace, out: TextIO) -> None:
    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    client = await Client.connect(args.target, namespace=args.namespace, plugins=[PydanticAIPlugin()])
    # `SandboxedWorkflowRunner()` is both classes' default, which `PydanticAIPlugin` fills with its passthroughs.
    def runner() -> WorkflowRunner:
        return UnsandboxedWorkflowRunner() if args.runner == "unsandboxed" else SandboxedWorkflowRunner()

    worker = Worker(client, task_queue=args.task_queue, workflows=[HarnessWorkflow], plugins=[AgentPlugin(AGENT)],
                    workflow_runner=runner())
    replayer = Replayer(workflows=[HarnessWorkflow], plugins=[PydanticAIPlugin()], workflow_runner=runner())
    loop = asyncio.get_running_loop()
    async with worker:
        send({"ready": True, "versions": versions()})
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            try:
                send(await measure(client, replayer, args.task_queue, json.loads(line)))
            except Exception:
                send({"error": traceback.format_exc()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target", required=True, help="the dev server's host:port")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--task-queue", default="bench-harness")
    parser.add_argument("--runner", choices=["sandboxed", "unsandboxed"], default="sandboxed",
                        help="the workflow runner of the worker and the replayer (default: Temporal's sandbox, "
                        "as the harness's docs set it up)")
    args = parser.parse_args()
    # The protocol gets its own copy of stdout; fd 1 then points at stderr for everyone else.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    code = 0
    try:
        asyncio.run(serve(args, out))
    except BaseException:
        traceback.print_exc()
        code = 1
    out.flush()
    sys.stderr.flush()
    os._exit(code)  # like run_bench: a script ending in Temporal calls can abort at interpreter exit


if __name__ == "__main__":
    main()
