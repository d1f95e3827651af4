r"""Helpers for testing agents: a scripted model that plays the model's part, the dev server, replay checks.

The scripted model is the one part a test fakes: it is a pydantic-ai `FunctionModel` that answers from a
script, so a test runs on a real Temporal server with real Monty and real tools, offline.

Example:
    ```python
    model = scripted_model(
        RunCode("page = await list_cart(offset=0)\nlen(page['items'])"),
        lambda messages: f"You have {last_result(messages)['result']} lines.",
    )
    ```

"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_core import to_jsonable_python
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, Worker, WorkflowReplayResult

from .client._devserver import start_dev_server
from .history._capture import REPLAY_BUILD_ID
from .shared._names import RUN_CODE_TOOL
from .worker._activities import CodeModeActivities
from .worker._agent import CodeModeAgent
from .worker._context import ToolCallContext, bind_call
from .worker._conversations import ConversationCache
from .worker._worker import create_worker, workflow_runner
from .workflow._run import CodeModeRunWorkflow

__all__ = [
    "CallTool",
    "FinalOutput",
    "RunCode",
    "Step",
    "child_processes",
    "conversation_cache",
    "fetch_chain_histories",
    "last_result",
    "new_task_queue",
    "replay",
    "running_worker",
    "scripted_model",
    "start_dev_server",
    "tool_call_context",
    "user_prompt",
]


@dataclass(frozen=True)
class RunCode:
    """A scripted `run_code` call."""

    code: str
    restart: bool = False
    id: str | None = None
    """The tool call id; default `call_<turn>` (`call_<turn>_<i>` when a step makes several calls)."""


@dataclass(frozen=True)
class CallTool:
    """A scripted direct tool call (a native tool, or any tool with code mode off)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class FinalOutput:
    """A scripted final answer for an agent with an `output_type`: a call to the output tool the request offers.

    `value` is the output as JSON data (a `BaseModel` as its dict; a list or scalar output is sent as pydantic-ai's
    wrapped `{"response": value}`). When the request offers no output tool (`NativeOutput`, `PromptedOutput`), the
    answer is `value` as JSON text instead.
    """

    value: Any
    tool: str | None = None
    """The output tool to call; default: the first one offered (`final_result` for one output type)."""
    id: str | None = None


Scripted = RunCode | CallTool | FinalOutput
Step = str | Scripted | Sequence[Scripted] | Callable[[list[ModelMessage]], "Step"]
"""A model turn: final text, one or more tool calls (a final output among them), or a function of the conversation
so far returning a step."""


def _final_output(output: FinalOutput, info: AgentInfo, call_id: str) -> TextPart | ToolCallPart:
    value = to_jsonable_python(output.value)
    if not info.output_tools:
        return TextPart(json.dumps(value))
    names = [t.name for t in info.output_tools]
    if output.tool is not None and output.tool not in names:
        raise RuntimeError(f"the scripted FinalOutput names output tool {output.tool!r}; the request offers {names}")
    args = value if isinstance(value, dict) else {"response": value}
    return ToolCallPart(output.tool or names[0], args, tool_call_id=call_id)


def last_result(messages: Sequence[ModelMessage], index: int = 0) -> Any:
    """What the run returned to the model last: the `index`-th tool return (or retry prompt) of the last request.

    For a `run_code` call this is the result object (`{'result': ..., 'printed': ...}`); for a call the model must
    retry (a syntax error, bad arguments), the message saying why.
    """
    request = next(m for m in reversed(messages) if isinstance(m, ModelRequest))
    return [p for p in request.parts if isinstance(p, ToolReturnPart)][index].content


def user_prompt(messages: Sequence[ModelMessage]) -> str:
    """The run's prompt: the first text the user sent, for scripted models that answer each prompt differently.

    Raises:
        ValueError: the conversation has no text prompt.

    """
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    raise ValueError("the conversation has no text prompt from the user")


def scripted_model(*steps: Step, name: str = "scripted", chunk_chars: int = 16,
                   chunk_delay: float = 0.0) -> FunctionModel:
    """A model that answers turn k with `steps[k]` (k = responses so far in the conversation).

    Being a function of the conversation, not of a counter, it gives the same answer to a retried request and
    keeps its place across continue-as-new. A run that asks for more turns than the script has gets an error
    saying so.

    It streams too (a run that streams its events asks it so): the same response, `chunk_chars` characters of text
    or tool arguments per chunk, `chunk_delay` seconds apart (0: as fast as it can; a benchmark's stand-in for a
    model's pace).
    """

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        if turn >= len(steps):
            raise RuntimeError(f"the scripted model has {len(steps)} turns and was asked for turn {turn + 1}")
        step: Any = steps[turn]
        while callable(step):
            step = step(messages)
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)], model_name=name)
        calls = [step] if isinstance(step, (RunCode, CallTool, FinalOutput)) else list(step)
        parts: list[TextPart | ToolCallPart] = []
        for i, call in enumerate(calls):
            default_id = f"call_{turn}" if len(calls) == 1 else f"call_{turn}_{i}"
            if isinstance(call, FinalOutput):
                parts.append(_final_output(call, info, call.id or default_id))
            elif isinstance(call, RunCode):
                args: dict[str, Any] = {"code": call.code}
                if call.restart:
                    args["restart"] = True
                parts.append(ToolCallPart(RUN_CODE_TOOL, args, tool_call_id=call.id or default_id))
            else:
                parts.append(ToolCallPart(call.name, dict(call.args), tool_call_id=call.id or default_id))
        return ModelResponse(parts=list(parts), model_name=name)

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        response = respond(messages, info)
        for index, part in enumerate(response.parts):
            assert isinstance(part, (TextPart, ToolCallPart)), "a scripted response has text and tool calls only"
            text = part.content if isinstance(part, TextPart) else part.args_as_json_str()
            for start in range(0, max(len(text), 1), chunk_chars):
                if chunk_delay:
                    await asyncio.sleep(chunk_delay)
                chunk = text[start:start + chunk_chars]
                if isinstance(part, TextPart):
                    yield chunk
                else:
                    yield {index: DeltaToolCall(name=part.tool_name if start == 0 else None, json_args=chunk,
                                                tool_call_id=part.tool_call_id if start == 0 else None)}

    return FunctionModel(respond, stream_function=stream, model_name=name)


def new_task_queue(prefix: str = "test") -> str:
    """A fresh task queue, so tests never share workers."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def running_worker(
    client: Client, agents: Sequence[CodeModeAgent], *, task_queue: str | None = None, **options: Any
) -> AsyncIterator[Worker]:
    """A worker serving `agents` on `task_queue` (default: a fresh one) for the duration of the block."""
    worker = create_worker(client, agents, task_queue=task_queue or new_task_queue(), **options)
    async with worker:
        yield worker


def conversation_cache(worker: Worker) -> ConversationCache:
    """The cache of recent runs' conversations of a worker `create_worker` made: what it holds, how often it asked.

    Raises:
        ValueError: `worker` serves no code-mode activities.

    """
    for function in worker.config().get("activities", ()):
        owner = getattr(function, "__self__", None)
        if isinstance(owner, CodeModeActivities):
            return owner.conversations
    raise ValueError("this worker serves no code-mode activities: give a worker made by create_worker()")


async def fetch_chain_histories(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    """The histories of every run of a continue-as-new chain, first to last."""
    client = handle._client  # not pydantic-ai: temporalio's WorkflowHandle keeps its client private
    run_id: str | None = handle.first_execution_run_id
    if run_id is None:
        # A handle from `get_workflow_handle(id)` (or one whose first run is unknown): every run's start event
        # names the chain's first run.
        latest = await client.get_workflow_handle(handle.id, run_id=handle.result_run_id or handle.run_id
                                                  ).fetch_history()
        run_id = latest.events[0].workflow_execution_started_event_attributes.first_execution_run_id
    histories = []
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.HasField("workflow_execution_continued_as_new_event_attributes") else None)
    return histories


async def replay(handle: WorkflowHandle[Any, Any]) -> list[WorkflowReplayResult]:
    """Replay every run of `handle`'s chain with Temporal's `Replayer`, offline; raise on any divergence."""
    # The client's converter, so runs whose large payloads live in a payload store replay too.
    # debug_mode: offline there is no 2 s deadlock detector, so no replay depends on this machine's speed.
    # The run's namespace: a payload store keys objects by namespace (S3's driver does), so a large payload the
    # replay re-encodes is found where the run wrote it, not written again under the Replayer's `ReplayNamespace`.
    client = handle._client  # not pydantic-ai: temporalio's WorkflowHandle keeps its client private
    replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=client.data_converter,
                        workflow_runner=workflow_runner(), debug_mode=True, build_id=REPLAY_BUILD_ID,
                        namespace=client.namespace)
    results = []
    for history in await fetch_chain_histories(handle):
        results.append(await replayer.replay_workflow(history))
    return results


@contextmanager
def tool_call_context(
    *, workflow_id: str = "test-run", call_id: str = "call_0.0", tool: str = "tool", attempt: int = 1
) -> Any:
    """Make `current_call()` work when a test calls a tool function directly."""
    with bind_call(ToolCallContext(workflow_id=workflow_id, call_id=call_id, tool=tool, attempt=attempt)) as ctx:
        yield ctx


def _listed_children(pid: int) -> list[str] | None:
    """The child pids of `pid`, from `/proc/<pid>/task/*/children`; `None` where the kernel has no such file.

    One read per thread instead of a scan of every process: the benchmarks sample this every 0.25 s, and the full
    scan took ~8% of a busy worker's CPU in `bench/throughput.py`.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        listed: list[str] = []
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                    listed.extend(f.read().decode().split())
            except FileNotFoundError:
                if task == tasks[0]:
                    return None  # no CONFIG_PROC_CHILDREN
            except OSError:
                continue  # the thread ended meanwhile
        return listed
    except OSError:
        return None


def child_processes(needle: bytes = b"monty") -> list[int]:
    """Live child processes of this process whose command line contains `needle` (Linux: read from /proc).

    The default finds this process's Monty sandbox processes, the pool's, checked out or idle: a test asserts none
    leaked or spun past the pool, or kills them as a crash would.
    """
    me = os.getpid()
    children = _listed_children(me)
    found: list[int] = []
    for entry in children if children is not None else os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ")".
            if int(stat.rsplit(b")", 1)[1].split()[1]) != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if needle in cmdline:
            found.append(int(entry))
    return found
