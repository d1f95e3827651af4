"""Configuration a user gives an agent: per-tool activity options and per-snippet limits.

Both are validated when they are built, so a bad value is an error at import time, never a workflow task that
fails inside workflow code and retries forever.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic_monty import MontyRuntimeError, ResourceLimits
from temporalio.common import RetryPolicy

from ._approvals import ApproverPolicy
from ._errors import CodeModeUserError

__all__ = [
    "AUTOMATIC_PAYLOAD_LIMIT_BYTES",
    "DEFAULT_TOOL_RETRY_POLICY",
    "LIVE_BACKSTOP_SECONDS",
    "LIVE_TASK_SECONDS",
    "CatalogSettings",
    "SnippetLimits",
    "ToolOptions",
]

AUTOMATIC_PAYLOAD_LIMIT_BYTES = 1024 * 1024
"""A tool call's arguments, and its result, at most, when the worker has no payload store (`None` limits)."""

DEFAULT_TOOL_RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
"""Bounded: a tool that keeps failing transiently reaches the program as an error after 3 attempts."""

#: Temporal fails a workflow task that does not yield for 2 s (TMPRL1101); a snippet's compute runs inside a
#: workflow task, so its limits stay well under that, with room for a replay on a slower, busier worker.
_DEADLOCK_MARGIN_SECONDS = 1.5

LIVE_BACKSTOP_SECONDS = 1.0
"""Seconds one request to a live workflow task's sandbox (a stretch of compute, a load, a dump) may take before
its process is killed (`worker/_pool`). A program past it is not lost: it goes on in the compute activity."""

LIVE_TASK_SECONDS = 1.5
"""Wall time a live workflow task may spend driving a program, a last stretch at the backstop included: a stretch
starts in workflow code only while the task has spent under `LIVE_TASK_SECONDS - LIVE_BACKSTOP_SECONDS` (else the
compute activity runs it, recorded). The rest of Temporal's 2 s is for the task's own work, which a loaded worker
slows (its Python shares the CPUs and the GIL): measured with four CPU burners on 2 cores, a task that gathered
500 calls spent 0.35 s of CPU in 1.85 s."""


@dataclass(frozen=True, kw_only=True)
class ToolOptions:
    """How one tool runs as a Temporal activity.

    Example:
        ```python
        CodeModeAgent(agent, tool_options={"charge_card": ToolOptions(timeout=timedelta(seconds=90))})
        ```

    """

    timeout: timedelta = timedelta(seconds=30)
    """Start-to-close timeout of one attempt. A timed-out attempt is retried within `retry_policy`."""

    retry_policy: RetryPolicy = field(default_factory=lambda: DEFAULT_TOOL_RETRY_POLICY)
    """Retries for transient failures only: a timeout, a lost worker, `TransientToolError`, `ConnectionError`.
    Any other exception a tool raises is final and reaches the program at once."""

    heartbeat_timeout: timedelta | None = timedelta(seconds=10)
    """How soon an attempt whose worker died is retried on another worker: the worker heartbeats while the tool
    runs, and Temporal gives up on the attempt once beats stop for this long (instead of waiting out `timeout`).
    `None`: no heartbeats. Not used by local activities, which die and are retried with their workflow task."""

    local: bool = False
    """Run as a local activity: ~10x cheaper per call, for short idempotent tools. While local activities run,
    queries and updates to the run wait, so keep this off for tools of agents that await approvals."""

    requires_approval: bool = False
    """Every call waits for a human decision before it runs (pydantic-ai's `requires_approval=True` on the tool
    means the same). A denial raises `PermissionError` at the call site inside the program."""

    approval_rule: Callable[[dict[str, Any]], bool] | None = None
    """Approval only for some calls: a pure function of the call's arguments (e.g. refunds over $100), evaluated
    in workflow code each time the call is made, and again on replay, so it must not read clocks, files or the
    network, and changing it changes how open runs replay. `requires_approval=True` wins over it."""

    approval_timeout: timedelta | None = None
    """How long a call waits for a decision before it is denied automatically; `None`: no limit."""

    approvers: ApproverPolicy | None = None
    """Who may decide this tool's calls, and how many must approve (`ApproverPolicy`); `None`: any decision the
    worker accepts (signed by any of its approver keys, or unsigned where the worker allows that). Recorded with
    the run when it starts; it applies to calls that need approval (`requires_approval`, `approval_rule`)."""

    in_sandbox: bool | None = None
    """`True`: callable from `run_code` snippets; `False`: a native tool the model calls directly; `None`:
    decided by the agent's `sandbox_tools` selection (default: every tool is in the sandbox)."""

    batch: bool = False
    """Group this tool's calls: the calls a program starts to it before it next waits (e.g. one `asyncio.gather`)
    run as one batch activity that runs them concurrently on the worker and returns each result or error on its
    own. Every call keeps its id, idempotency key, call record, trace line and catchable error. For read-only
    tools: a call whose result does not fit its batch's payload runs again on its own (see the README's
    "Batched calls"). Options apply per call (`timeout` and `retry_policy` for each call inside the batch); a
    batch's activity gets the time of every attempt of one call, heartbeats the results done so far, and a retry
    after a lost worker runs only the calls not done yet. Recorded when a run starts, so changing it never changes
    how a run replays. Refused with `local`, approvals (`requires_approval`, `approval_rule`, `approvers`),
    `in_sandbox=False` and `heartbeat_timeout=None`."""

    def __post_init__(self) -> None:
        if self.timeout <= timedelta(0):
            raise CodeModeUserError(f"ToolOptions.timeout must be positive, got {self.timeout}")
        if self.heartbeat_timeout is not None and self.heartbeat_timeout <= timedelta(0):
            raise CodeModeUserError(
                f"ToolOptions.heartbeat_timeout must be positive or None (no heartbeats), got {self.heartbeat_timeout}")
        if self.retry_policy.maximum_attempts == 0:
            raise CodeModeUserError(
                "ToolOptions.retry_policy.maximum_attempts is 0, which Temporal reads as 'retry forever'; "
                "tool failures must be bounded: set a number of attempts (1 disables retries)"
            )
        if self.batch:
            self._check_batch()

    def _check_batch(self) -> None:
        """Refuse the options a batch cannot honour, by name (each would otherwise be silently dropped)."""
        conflicts = [why for on, why in (
            (self.local, "local=True (a local activity cannot heartbeat the calls a batch has done, so a retry "
                         "would run them all again)"),
            (self.requires_approval, "requires_approval=True (a call waiting for a person cannot share an activity "
                                     "with calls that run at once)"),
            (self.approval_rule is not None, "an approval_rule (some calls would wait for a person)"),
            (self.approvers is not None, "approvers (batched calls never wait for a decision)"),
            (self.in_sandbox is False, "in_sandbox=False (only calls from run_code programs are batched; the "
                                       "model calls a native tool one call at a time)"),
            (self.heartbeat_timeout is None, "heartbeat_timeout=None (a batch heartbeats the calls it has done, "
                                             "so a retry after a lost worker skips them)"),
        ) if on]
        if conflicts:
            raise CodeModeUserError(
                f"ToolOptions(batch=True) cannot be combined with {'; nor with '.join(conflicts)}: drop batch=True "
                "for this tool, or the conflicting option (see the README's \"Batched calls\")")


@dataclass(frozen=True, kw_only=True)
class SnippetLimits:
    """Bounds on one `run_code` snippet, and on a run's size.

    The limits a run starts with are recorded in its history and used by every replay of it, so a deploy that
    changes them never changes how an old run replays.
    """

    max_tool_calls: int = 500
    """Tool calls one snippet may make; further calls raise `RuntimeError` inside the snippet."""

    max_memory_bytes: int = 256 * 1024 * 1024
    """Heap of the sandbox; past it the snippet stops with `MemoryError`."""

    max_recursion_depth: int = 500
    """Call depth inside the sandbox; past it `RecursionError` (catchable)."""

    max_output_bytes: int = 64 * 1024
    """Size of a snippet's result (value and printed text, as JSON) returned to the model; the rest is cut,
    with a note saying so."""

    max_turn_seconds: float = 0.4
    """The in-workflow budget of one stretch of compute (between two host round trips: tool calls, clock reads).
    A stretch past it is recorded in the history, so no replay re-runs it: one the workflow task finished is
    kept; one still computing at 1 s (`LIVE_BACKSTOP_SECONDS`) goes on in the compute activity. Either
    way the program goes on; the budget only decides where it computes."""

    max_feed_seconds: float = 0.5
    """The in-workflow budget of one workflow task: wall time since its activation began (its other jobs, such as a
    gather's results, then the program's stretches and the answers to its host calls). Past it, the stretch that
    crossed it is recorded, as for `max_turn_seconds`, and the program goes on after a round trip to the compute
    activity; a task near it (`LIVE_TASK_SECONDS`) starts no later stretch in workflow code. Wall time, not CPU time: a
    loaded worker's task gets less done in it, never more time, so Temporal's 2 s deadlock limit is kept under
    load."""

    max_compute_seconds: float = 60.0
    """Compute one stretch may do in the compute activity (between two host round trips). Past it the program
    is a runaway (a `while True`): the snippet fails with an error for the model, and the REPL goes back to what
    it was before the snippet. At most an hour."""

    max_snippets_per_run: int = 25
    """Snippets one workflow run executes before it continues as new at the next model turn. With no workflow
    cache, one workflow task replays every earlier snippet: this keeps that replay far from the 10 s workflow
    task timeout."""

    max_carried_repl_bytes: int = 1024 * 1024
    """Largest REPL dump carried across continue-as-new (it travels in the new run's input, under Temporal's 2 MiB
    payload limit with the conversation); a bigger REPL is restarted, with a note to the model."""

    max_tool_args_bytes: int | None = None
    """Size of one tool call's arguments (as JSON); a bigger call raises `ValueError` in the program and does not
    run. Calls in flight at once may carry twice this. `None` (automatic): 1 MiB when the worker has no payload
    store (Temporal refuses payloads over 2 MiB, and a workflow task sending over 4 MiB gets the run terminated),
    no limit with one. Resolved when a run starts and recorded with the other limits."""

    max_tool_result_bytes: int | None = None
    """Size of one tool result (as JSON); a bigger result is not returned (the tool did run) and the program gets
    a `RuntimeError` naming this limit. `None` (automatic): 1 MiB when the worker has no payload store, no limit
    with one. Checked by the worker that runs the tool, with its current configuration."""

    max_model_requests: int = 50
    """Model requests over the whole agent run (across continue-as-new); past it the run fails with a clear
    error instead of looping forever."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("max_tool_calls", "max_memory_bytes", "max_recursion_depth", "max_output_bytes",
                     "max_snippets_per_run", "max_model_requests", "max_carried_repl_bytes"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_tool_args_bytes", "max_tool_result_bytes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1 or None (automatic), got {getattr(self, name)}")
        if not 0 < self.max_compute_seconds <= 3600:
            problems.append(f"max_compute_seconds must be in (0, 3600] seconds, got {self.max_compute_seconds}")
        for name in ("max_turn_seconds", "max_feed_seconds"):
            value = getattr(self, name)
            if not 0 < value <= _DEADLOCK_MARGIN_SECONDS:
                problems.append(
                    f"{name} must be in (0, {_DEADLOCK_MARGIN_SECONDS}] seconds, got {value}: snippets run inside "
                    "a workflow task, which Temporal fails after 2 s without a yield"
                )
        if problems:
            raise CodeModeUserError("invalid SnippetLimits: " + "; ".join(problems))


@dataclass(frozen=True, kw_only=True)
class CatalogSettings:
    """When an agent's sandbox tools are too many to send every stub to the model on each request.

    Every stub goes into the `run_code` description, and the description goes with every model request: a
    300-tool catalog costs tens of thousands of input tokens per turn before the model reads the prompt. Past
    either bound, the description lists one line per tool (its name and the first line of its docstring)
    instead, and programs find and read the rest with two functions answered in workflow code from the run's
    recorded catalog (no activity, no extra model turn): `search_tools(query)` and `describe_tool(name)`. Every
    tool stays callable, and programs are still type-checked against every full stub.

    Which view a run gets is decided when it starts and recorded with it, so changing these settings never
    changes how a run already started replays.

    Example:
        ```python
        CodeModeAgent(agent, catalog=CatalogSettings(max_tools=20))  # index past 20 sandbox tools
        ```

    """

    max_tools: int = 40
    """Sandbox tools the description may list in full; with more, it carries the index."""

    max_stub_tokens: int = 4000
    """Estimated tokens (characters / 4, about what models' tokenizers give for English and Python) the sandbox
    tools' stubs may take in the description; past it, the description carries the index. When the index itself
    (a line per tool: ~20 tokens, so past ~200 tools) is over this too, it lists only the tools' names, and
    `search_tools` gives their summaries."""

    mode: Literal["auto", "index", "stubs"] = "auto"
    """`auto`: the index past either bound, every stub otherwise; `index`: always the index (when the agent has
    sandbox tools); `stubs`: always every stub, however large (and tools may then be named `search_tools` or
    `describe_tool`)."""

    def __post_init__(self) -> None:
        problems = [f"{name} must be at least 1, got {getattr(self, name)}"
                    for name in ("max_tools", "max_stub_tokens") if getattr(self, name) < 1]
        if self.mode not in ("auto", "index", "stubs"):
            problems.append(f"mode must be 'auto', 'index' or 'stubs', got {self.mode!r}")
        if problems:
            raise CodeModeUserError("invalid CatalogSettings: " + "; ".join(problems))

    def wants_index(self, *, tools: int, stub_tokens: int) -> bool:
        """Whether a catalog of `tools` sandbox tools whose stubs take `stub_tokens` gets the index."""
        if self.mode != "auto":
            return self.mode == "index" and tools > 0
        return tools > self.max_tools or stub_tokens > self.max_stub_tokens


def is_time_limit(error: MontyRuntimeError) -> bool:
    """Whether `error` is the session's own time limit (`max_turn_duration_secs` / `max_feed_duration_secs`)."""
    exc = error.exception()
    return isinstance(exc, TimeoutError) and "time limit exceeded" in str(exc)


REPLAY_STRETCH_SECONDS = 60.0
"""The least time limit of a replayed stretch (see `monty_limits`)."""


def monty_limits(limits: SnippetLimits, *, replaying: bool = False) -> ResourceLimits:
    """The limits a sandbox session enforces itself, for `checkout(limits=...)`.

    A session's dumps carry its limits, and a loaded dump keeps them (Monty applies no new ones), so a program
    that goes on in the compute activity computes under the limits its REPL was first checked out with. So every
    session's own time limit is `max_compute_seconds`, the runaway bound: the in-workflow budgets are enforced by
    the host (`workflow/_snippet_driver`) and by the live pool's backstop, which may differ between stretches. A
    replayed task re-runs only stretches the live run finished in workflow code, so its sessions get a time limit no
    replaying machine can reach (`REPLAY_STRETCH_SECONDS`, or more): their outcome never depends on the replaying
    machine's speed, and a history edited into a loop still ends.
    """
    out: ResourceLimits = {
        "max_memory": limits.max_memory_bytes,
        "max_recursion_depth": limits.max_recursion_depth,
        # Our own bound is tool calls per snippet; Monty's counts every suspension of the whole session (clock
        # reads, future resolutions) and cannot be disabled, so it is set far out of the way.
        "max_suspensions": 1_000_000_000,
    }
    out["max_turn_duration_secs"] = (max(limits.max_compute_seconds, REPLAY_STRETCH_SECONDS) if replaying
                                     else limits.max_compute_seconds)
    return out
