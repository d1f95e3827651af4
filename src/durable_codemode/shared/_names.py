"""Every name this library writes into a Temporal history, built in one place.

These names are compatibility data: a run started by one version of a worker is replayed by the next, so
renaming a Python class or function must never rename anything recorded. `tests/test_compat.py` pins them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = [
    "AFTER_RUN_ACTIVITY",
    "AGENT_MEMO",
    "AGENT_SEARCH_ATTRIBUTE",
    "BATCH_ACTIVITY",
    "CHILD_APPROVALS_SIGNAL",
    "CHILD_DEPS_ACTIVITY",
    "CHILD_DEPS_METADATA",
    "CHILD_RUNS_QUERY",
    "CHILD_RUN_METADATA",
    "COMPUTE_ACTIVITY",
    "CONVERSATION_QUERY",
    "DESCRIBE_AGENT_ACTIVITY",
    "MODEL_REQUEST_ACTIVITY",
    "MODEL_TOOLS_QUERY",
    "OUTPUT_ACTIVITY",
    "OUTPUT_CHECK_SUMMARY",
    "RUN_CODE_TOOL",
    "RUN_ERROR_ACTIVITY",
    "SEAL_REPL_ACTIVITY",
    "STATUS_CANCELLED",
    "STATUS_COMPLETED",
    "STATUS_FAILED",
    "STATUS_MEMO",
    "STATUS_RUNNING",
    "STATUS_SEARCH_ATTRIBUTE",
    "STATUS_WAITING",
    "STREAM_INFO_QUERY",
    "WORKFLOW_TYPE",
    "approval_verdict_marker",
    "batch_activity_id",
    "call_digest",
    "call_fingerprint",
    "call_id_of_activity",
    "child_deps_activity_id",
    "child_run_id",
    "compute_activity_id",
    "compute_marker",
    "nested_call_id",
    "tool_activity_id",
    "tool_activity_type",
    "tool_of_activity_type",
    "type_check_rejection_marker",
]

WORKFLOW_TYPE = "durable-codemode.run"
"""The workflow type of every agent run; the agent's name is part of the input (and the memo)."""

CHILD_APPROVALS_SIGNAL = "durable-codemode.child_approvals"
"""What a child run (a sub-agent a tool runs durably, `child_run_tool`) sends its parent whenever the calls it waits
on for a person change (`ChildApprovals`). Anyone who can reach the server can send a signal, so no one lists calls
from it any more: a client reads a child's calls from the child itself (`CHILD_RUNS_QUERY`). Still sent and heard,
as recorded runs did, so their histories replay."""

CHILD_RUNS_QUERY = "durable-codemode.child_runs"
"""The query a run answers with its child runs in flight (`ChildRun`): where a client reads the calls its children
wait on, from each child itself (a query, so never in a history; pinned as the client and worker must agree)."""

CONVERSATION_QUERY = "durable-codemode.conversation"
"""Messages of a run's conversation, answered from workflow memory: what a worker that does not hold the messages
an activity input refers to asks for (`shared._conversation`)."""

MODEL_TOOLS_QUERY = "durable-codemode.model_tools"
"""The tool definitions a run offers its model, as JSON: what a worker asks for when a model request refers to
them (`ModelRequestInput.tools_ref`) and it does not hold them."""

STREAM_INFO_QUERY = "durable-codemode.stream_info"
"""Whether a run streams its events, and the offsets its stream keeps (`StreamInfo`); the events themselves are
read with Workflow Streams' own poll query (`client/_stream`)."""

CHILD_RUN_METADATA = "codemode_child_run"
"""The tool metadata key naming the agent a `child_run_tool` runs as a child run; recorded as `ToolSpec.child_run`."""

CHILD_DEPS_METADATA = "codemode_child_deps"
"""The tool metadata key saying a `child_run_tool` derives its child's deps from the parent's run context (`deps=`);
recorded as `ToolSpec.child_deps`."""

CHILD_DEPS_ACTIVITY = "durable-codemode.child_deps"
"""The activity that derives a child run's deps from its parent's run context, before the child starts."""


def child_deps_activity_id(call_id: str) -> str:
    """The activity id of the call `call_id`'s child deps (`CHILD_DEPS_ACTIVITY`): one per call, in its run."""
    return f"{call_id}-child-deps"


def child_run_id(parent_id: str, call_id: str) -> str:
    """The workflow id of the child run a parent's call `call_id` starts: unique per call, and found from both."""
    return f"{parent_id}/{call_id}"


MODEL_REQUEST_ACTIVITY = "durable-codemode.model_request"
"""One model request: the conversation so far in, one `ModelResponse` out."""

DESCRIBE_AGENT_ACTIVITY = "durable-codemode.describe_agent"
"""Records the agent's instructions, tools, stubs and limits at the start of a run, so replay uses them."""

OUTPUT_ACTIVITY = "durable-codemode.output"
"""Checks a response that may end the run against the agent's output type and output validators (pydantic-ai's
own output processing, with the run's deps): the validated output, or pydantic-ai's retry request."""

AFTER_RUN_ACTIVITY = "durable-codemode.after_run"
"""Runs the capabilities' `after_run` hooks on a run's result, once its output is decided: the output they return
(pydantic-ai's `AgentRunResult.output`, maybe replaced) is the run's."""

RUN_ERROR_ACTIVITY = "durable-codemode.on_run_error"
"""Runs the capabilities' `on_run_error` hooks on a run's failure (one its body decided: a usage limit, the output
retries, a model request's final error): the result they return recovers the run, or what they raise fails it."""

OUTPUT_CHECK_SUMMARY = "check the output of model turn "
"""The start of an output activity's summary, followed by its turn's index (read back by `codemode trace`)."""

SEAL_REPL_ACTIVITY = "durable-codemode.seal_repl"
"""Seals a REPL dump with the worker's key before continue-as-new, and checks the seal after (`_carry`)."""

COMPUTE_ACTIVITY = "durable-codemode.compute"
"""Records a stretch of compute past the in-workflow budget, computing it first if needed (`worker/_compute`)."""

BATCH_ACTIVITY = "durable-codemode.tool_batch"
"""Runs the calls of one batched tool (`ToolOptions(batch=True)`) a program had in flight at once; its input is a
`BatchInput` naming the agent and the tool, its result one `BatchOutcome` per call."""

RUN_CODE_TOOL = "run_code"
"""The one tool the model sees in code mode."""

AGENT_SEARCH_ATTRIBUTE = "CodemodeAgent"
"""Keyword search attribute: the run's agent, set when the run starts (if the server has it registered)."""

STATUS_SEARCH_ATTRIBUTE = "CodemodeStatus"
"""Keyword search attribute: `running`, `waiting` while a call waits for approval, then how the run's own code
ended it: `completed`, `failed` or `cancelled` (runs of behaviour version 2 on). Temporal can end a run without its
code running (terminate, an execution timeout): it then keeps the status it had, and visibility's own
`ExecutionStatus` says the run is closed."""

AGENT_MEMO = "agent"
"""Memo key of the run's agent (every run has it)."""

STATUS_MEMO = "status"
"""Memo key of the status, for runs started on a server without the search attributes."""

STATUS_RUNNING = "running"
STATUS_WAITING = "waiting"
STATUS_COMPLETED = "completed"
STATUS_FAILED = "failed"
STATUS_CANCELLED = "cancelled"


def tool_activity_type(agent: str, tool: str) -> str:
    """The activity type of a tool: `<agent>.<tool>`, so two agents may both have a `list_items` tool."""
    return f"{agent}.{tool}"


def tool_of_activity_type(activity_type: str) -> str:
    """The tool of a `<agent>.<tool>` activity type (agent names may hold dots; tool names do not)."""
    return activity_type.rpartition(".")[2]


def nested_call_id(run_code_call_id: str, n: int) -> str:
    """`<run_code call id>.<n>`: stable across replays and retries, so tools can use it as an idempotency key."""
    return f"{run_code_call_id}.{n}"


def compute_marker(snippet: int, run_code_call_id: str, stretch: int) -> str:
    """The `workflow.patched` id recording "stretch `stretch` of this program came from the compute activity".

    `snippet` counts the run's snippets (a model that reuses a call id cannot collide) and `stretch` the
    program's stretches of compute (0: from the snippet's start to its first host round trip; n: from the answer
    to round trip n). A replay asks for the marker before each stretch, and takes the recorded outcome instead
    of running it, so where a program went past its budget is read from the history, never timed again.
    """
    return f"durable-codemode.compute.{snippet}.{run_code_call_id}.{stretch}"


def type_check_rejection_marker(snippet: int, run_code_call_id: str) -> str:
    """The `workflow.patched` id recording "the type checker rejected this snippet, live".

    A replay reads it instead of
    checking the snippet again: a snippet without it passed (or ran unchecked), so it starts unchecked. The check
    is most of what a replayed snippet costs, and a clean pass, the common case, records nothing (each patch
    marker is two history events: the marker and Temporal's `TemporalChangeVersion` upsert).
    """
    return f"durable-codemode.typecheck.rejected.{snippet}.{run_code_call_id}"


def approval_verdict_marker(ruled: int, call_id: str) -> str:
    """The `workflow.patched` id recording "the tool's approval rule sent call `call_id` to a person".

    `ruled` counts the run's calls to tools with a rule (a model that reuses a call id cannot collide). Only a
    call the rule gates records it: a replay asks for the marker instead of asking the rule, and a call without it
    needed no approval. So a deploy that changes or drops the rule never changes what an old run replays, and a
    replay needs no rule at all (runs of behaviour version 2 on).
    """
    return f"durable-codemode.approval.{ruled}.{call_id}"


def compute_activity_id(run_code_call_id: str, stretch: int) -> str:
    """`<run_code call id>.compute.<stretch>`: the compute activity of one stretch of a program."""
    return f"{run_code_call_id}.compute.{stretch}"


def _canonical(value: Any) -> Any:
    # A sandbox set arrives as a host set whose iteration order follows PYTHONHASHSEED: sort it, or two
    # workers would hash the same call differently.
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _call_text(tool: str, arguments: dict[str, Any]) -> bytes:
    """(tool, arguments) as canonical JSON: keys sorted, sets in order, the same on every worker."""
    return json.dumps([tool, _canonical(arguments)], sort_keys=True, default=repr, separators=(",", ":")).encode()


def call_digest(tool: str, arguments: dict[str, Any]) -> str:
    """A short hash of (tool, arguments).

    Temporal does not compare activity arguments on replay, so a replay that calls a tool with other arguments
    would silently reuse the recorded result. With this digest in the activity id, it is a loud
    nondeterminism error instead.
    """
    return hashlib.sha256(_call_text(tool, arguments)).hexdigest()[:10]


def call_fingerprint(tool: str, arguments: dict[str, Any]) -> str:
    """The whole SHA-256 of (tool, arguments), in hex: what a signed decision covers of the call it decides.

    `call_digest` is its first 10 characters, enough to tell calls apart but not to stop someone from making up
    other arguments with the same digest; a signature covers all 64.
    """
    return hashlib.sha256(_call_text(tool, arguments)).hexdigest()


def tool_activity_id(call_id: str, tool: str, arguments: dict[str, Any]) -> str:
    """The activity id of a nested or direct tool call: `<call id>-<digest of tool and arguments>`."""
    return f"{call_id}-{call_digest(tool, arguments)}"


def call_id_of_activity(activity_id: str) -> str:
    """The call id in a tool call's activity id (`tool_activity_id`): all before the last `-` (the digest's)."""
    return activity_id.rpartition("-")[0]


def batch_activity_id(call_ids: list[str], tool: str, arguments: list[dict[str, Any]]) -> str:
    """`<first call id>+<calls>-<digest>`: a batch's activity id, with a digest of every call's id and arguments.

    As for a single call (`tool_activity_id`): a replay whose program batches other calls, or the same calls with
    other arguments, is a loud nondeterminism error instead of silently reused results.
    """
    text = json.dumps([tool, call_ids, [_canonical(a) for a in arguments]], sort_keys=True, default=repr,
                      separators=(",", ":"))
    return f"{call_ids[0]}+{len(call_ids)}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


DEFAULT_TASK_QUEUE = "durable-codemode"
"""The task queue runs go to unless told otherwise (also the bundled worker's)."""
