"""What a program may send to a tool, and how much it may do between two waits: the guards of the sandbox.

Each guard turns something that would break the workflow task (and so wedge the run in task retries, or get it
terminated by the server) into an exception the program sees, or a stop the model is told about:

- an argument the payload converter cannot encode (a sandbox function, bytes that are not UTF-8) fails the
  workflow task when the activity is scheduled;
- an argument over Temporal's 2 MiB payload limit fails the task, and the arguments of one workflow task's
  scheduled calls over the 4 MiB gRPC limit get the run terminated;
- the server refuses more than 2,000 pending activities per run;
- a loop whose host round trips are all answered at once (a refused call caught and retried, a busy-wait on the
  clock, which is frozen within a workflow task) never yields, and Temporal fails a task that does not yield
  within 2 s. Monty's compute limits do not see it: they exclude the host's time.

Every check counts or measures what the program did, never wall time, so a replay decides the same way.
This module runs in workflow code.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from pydantic_core import to_json

from ._sandbox_types import Settled

__all__ = [
    "MAX_ANSWERS_WITHOUT_WAIT",
    "MAX_CALLS_IN_FLIGHT",
    "args_bytes",
    "call_refusal",
    "non_json_problem",
    "output_overflow_message",
    "stopped_message",
]

MAX_CALLS_IN_FLIGHT = 500
"""Tool calls one program may have started and not yet seen settle. Every call started before the program next
waits is scheduled in one workflow task: 500 took up to ~1.2 s of a task here, against Temporal's 2 s limit
(and the server's 2,000 pending activities per run)."""

MAX_ANSWERS_WITHOUT_WAIT = 2_000
"""Host round trips (refused calls, clock and environment reads, started calls) one program may make without
waiting once on Temporal; past it the program is stopped. One costs ~50 µs in Monty alone on this (loaded)
machine, ~100 µs with the driver, so this stays well under the 2 s a workflow task may run without yielding,
with room for a slower replay; a useful program (500 gathered calls, a clock read per item) stays below it."""

_SCALARS = (str, int, float, bool, type(None), datetime.datetime, datetime.date)


def non_json_problem(value: Any, where: str) -> str | None:
    """Why `value` cannot be sent to a tool as JSON (naming the offending part), or `None` when it can."""
    stack: list[tuple[Any, str]] = [(value, where)]
    seen = 0
    while stack:
        item, path = stack.pop()
        seen += 1
        if isinstance(item, float) and not math.isfinite(item):
            return f"{path} is {item!r}, which JSON cannot represent"
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, (str, int)):
                    return f"{path} has a key of type {type(key).__name__}; JSON object keys are strings"
                stack.append((sub, f"{path}[{key!r}]"))
            continue
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((sub, f"{path}[{i}]") for i, sub in enumerate(item))
            continue
        kind = "bytes" if isinstance(item, (bytes, bytearray)) else type(item).__name__
        hint = " (decode it to str, or base64-encode it)" if kind == "bytes" else ""
        return f"{path} is a {kind} value{hint}; tools take JSON values: str, int, float, bool, None, lists, dicts"
    return None


def args_bytes(kwargs: dict[str, Any]) -> int:
    """The size of a call's arguments as the payload converter writes them (JSON)."""
    return len(to_json(kwargs))


def stopped_message(answers: int) -> str:
    """What the model is told when a program is stopped for `MAX_ANSWERS_WITHOUT_WAIT` round trips."""
    return (
        f"The program was stopped: it made {answers:,} host calls in a row (refused or failed calls, clock or "
        "environment reads, file calls) without waiting once for a tool or a sleep, which looks like a loop that "
        "catches an exception and tries again, or a busy-wait on the clock (time does not move while a program "
        "computes). The REPL was restarted: variables from earlier run_code calls are gone. Handle the error "
        "instead of retrying at once, or use asyncio.sleep to wait; for files, use fewer, larger ones, or split "
        "the work across run_code calls."
    )


def output_overflow_message(error: str, *, collector_cap: int, limit: int) -> str | None:
    """The model's message when a program's printing hit the output cap, or `None` for any other error.

    Monty's print collector stops the program with a `MemoryError` naming its cap, which reads like the memory
    limit; this says what happened instead.
    """
    if not (error.startswith("MemoryError") and error.endswith(f"> {collector_cap} bytes")):
        return None
    return (f"OutputLimitError: the program printed more than the {limit:,}-byte output limit "
            "(SnippetLimits.max_output_bytes) and was stopped at that print; the printed text up to there is "
            "shown. Print less: counts, ids or a summary, or return the value instead.")


def call_refusal(name: str, kwargs: dict[str, Any], *, in_flight: int, limit: int | None,
                 args_in_flight: dict[int, int]) -> tuple[Settled | None, int]:
    """Why a call must not start (the exception the program gets, or `None`), and its argument bytes.

    `in_flight`: the program's calls started and not yet settled; `limit`: `SnippetLimits.max_tool_args_bytes`;
    `args_in_flight`: the argument bytes of those calls, by Monty call id. See the module docstring for what each
    refusal prevents.
    """
    problem = non_json_problem(kwargs, "the arguments")
    if problem is not None:
        return {"exc_type": "TypeError", "message": f"{name}(): {problem}"}, 0
    if in_flight >= MAX_CALLS_IN_FLIGHT:
        return {"exc_type": "RuntimeError", "message": f"{name}(): {in_flight} tool calls are already in "
                f"flight, the most a program may have at once; gather at most {MAX_CALLS_IN_FLIGHT} calls "
                "at a time (in batches)"}, 0
    if limit is None:
        return None, 0
    size = args_bytes(kwargs)
    if size > limit:
        return {"exc_type": "ValueError", "message": f"{name}(): the arguments are {size:,} bytes of JSON, "
                f"over the {limit:,}-byte limit for one tool call (SnippetLimits.max_tool_args_bytes); pass "
                "less per call (an id, a page, a slice), or have the tool fetch the data itself"}, 0
    pending = sum(args_in_flight.values())
    if pending + size > 2 * limit:
        return {"exc_type": "RuntimeError", "message": f"{name}(): the calls in flight already carry "
                f"{pending:,} bytes of arguments, and this one {size:,}, over the {2 * limit:,} bytes calls in "
                "flight may carry at once (twice SnippetLimits.max_tool_args_bytes); await some of them "
                "first, or gather fewer at a time"}, 0
    return None, size
