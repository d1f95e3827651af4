"""A replay reads the type checker's verdicts from the history instead of checking each snippet again.

The check is most of a replayed snippet's cost, and its verdict is decided once, live: a rejection is recorded
(a `workflow.patched` marker), and a snippet without one passed, so a replay starts it unchecked. On a worker
that caches no workflow every workflow task replays the run so far before it goes on live: the markers must hold
the replay to what the run did, and the checks after a replay must not reject names the skipped snippets defined.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic_ai.messages import ModelRequest, RetryPromptPart, ToolReturnPart
from temporalio.client import Client, WorkflowHandle

from durable_codemode import RunResult
from durable_codemode.testing import RunCode

from ._agents import items_agent
from ._runs import run_to_end


def recorded_verdicts(history: Any) -> list[str]:
    """The type-check markers of a history, as `rejected.<snippet>`, in the order they were recorded."""
    found = []
    for event in history.events:
        attrs = event.marker_recorded_event_attributes
        if event.HasField("marker_recorded_event_attributes") and "patch-data" in attrs.details:
            patch = json.loads(attrs.details["patch-data"].payloads[0].data)["id"]
            if patch.startswith("durable-codemode.typecheck."):
                verdict, snippet = patch.split(".")[2:4]
                found.append(f"{verdict}.{snippet}")
    return found


async def run(client: Client, *steps: Any, **worker_options: Any) -> tuple[RunResult, WorkflowHandle[Any, Any]]:
    return await run_to_end(client, items_agent(f"verdicts{os.urandom(3).hex()}", *steps), **worker_options)


def answers(messages: Any) -> list[str]:
    """What every `run_code` call of the conversation got back (results, or the retry prompt of a rejection)."""
    return [str(part.content) for m in messages if isinstance(m, ModelRequest) for part in m.parts
            if isinstance(part, ToolReturnPart | RetryPromptPart)]


STEPS = (
    RunCode("items = [await get(i=1)]"),  # passed
    RunCode("items = 'rebound'"),  # lenient: rebinding a REPL variable is ordinary REPL use
    RunCode("await get(i='one')"),  # rejected: a wrong argument type
    RunCode("len(items)"),  # uses a name that snippets whose check a replay skipped assigned
    lambda messages: json.dumps(answers(messages)),
)


async def test_only_rejections_are_recorded_and_a_replay_follows_them(client: Client) -> None:
    result, handle = await run(client, *STEPS, max_cached_workflows=0)  # every workflow task replays the run
    history = await handle.fetch_history()
    assert recorded_verdicts(history) == ["rejected.3"]
    got = json.loads(result.output)
    assert "not run" in got[2] and "invalid-argument-type" in got[2], got
    # Once a replay skipped snippet 1's check, `items` is unknown to the checker: snippet 4 is left to the runtime.
    assert "7" in got[3], got  # len('rebound'): the REPL kept what snippet 2 assigned, and the check let it run
    # A passing snippet adds no event (a patch marker would add two: the marker and a search attribute upsert).
    upserts = [e for e in history.events if e.HasField("upsert_workflow_search_attributes_event_attributes")
               and "CodemodeStatus" not in e.upsert_workflow_search_attributes_event_attributes.search_attributes
               .indexed_fields]  # the run's status at its end is no verdict
    assert len(upserts) == 1, upserts


async def test_a_cached_run_records_the_same(client: Client) -> None:
    result, handle = await run(client, *STEPS)
    assert recorded_verdicts(await handle.fetch_history()) == ["rejected.3"]
    assert "7" in json.loads(result.output)[3]


async def test_a_replay_keeps_a_rejection_its_own_check_would_not_make(client: Client) -> None:
    # Live, the checker knows `x` is an int and rejects `x.upper()`. A replay skips snippet 1's check, so `x` is
    # unknown to it and the check finds nothing: the recorded verdict still holds, and `get` is never called
    # (the Replayer in `run` would fail on the activity it schedules otherwise).
    steps = (RunCode("x = 1"), RunCode("await get(i=1)\nx.upper()"), lambda m: json.dumps(answers(m)))
    result, handle = await run(client, *steps)
    assert recorded_verdicts(await handle.fetch_history()) == ["rejected.2"]
    assert "not run" in json.loads(result.output)[1]
    assert result.nested_calls == []
