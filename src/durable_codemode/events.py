"""The events of a run's live stream (`durable_codemode.stream_events`): code mode's own, beside pydantic-ai's.

A streaming run publishes pydantic-ai's own events for what pydantic-ai would emit (the model's `PartStartEvent`,
`PartDeltaEvent`, `PartEndEvent`, `FinalResultEvent`; `FunctionToolCallEvent` and `FunctionToolResultEvent` for
`run_code` and the tools the model calls directly) and these, for what only code mode does. Each is a pydantic-ai
`CustomEvent` named in the `codemode.` namespace, so any consumer of pydantic-ai's `AgentStreamEvent` takes it:

```python
from durable_codemode import stream_events
from durable_codemode.events import NestedCallEndEvent, PrintEvent


async def show(client, run_id):
    async for item in stream_events(client, run_id):
        match item.event:
            case NestedCallEndEvent(call_id=call, status=status, seconds=seconds):
                print(f"{call} {status} in {seconds:.2f} s")
            case PrintEvent(text=text):
                print(text, end="")
```
"""

from .client._stream import RunEventItem
from .shared._run_events import (
    ApprovalDecidedEvent,
    ApprovalWaitEvent,
    ChildRunEndEvent,
    ChildRunStartEvent,
    CodeModeEvent,
    ComputeEscalatedEvent,
    EventStreamSettings,
    EventsTrimmedEvent,
    ModelRequestStartEvent,
    ModelStreamResetEvent,
    NestedCallEndEvent,
    NestedCallStartEvent,
    PrintEvent,
    RunContinuedEvent,
    RunEndEvent,
    RunEndStatus,
    RunStartEvent,
    SnippetEndEvent,
    SnippetStartEvent,
)

__all__ = [
    "ApprovalDecidedEvent",
    "ApprovalWaitEvent",
    "ChildRunEndEvent",
    "ChildRunStartEvent",
    "CodeModeEvent",
    "ComputeEscalatedEvent",
    "EventStreamSettings",
    "EventsTrimmedEvent",
    "ModelRequestStartEvent",
    "ModelStreamResetEvent",
    "NestedCallEndEvent",
    "NestedCallStartEvent",
    "PrintEvent",
    "RunContinuedEvent",
    "RunEndEvent",
    "RunEndStatus",
    "RunEventItem",
    "RunStartEvent",
    "SnippetEndEvent",
    "SnippetStartEvent",
]
