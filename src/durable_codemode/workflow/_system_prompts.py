"""A run's system prompts in workflow code: the parts that open a conversation, and dynamic ones re-valued.

pydantic-ai re-runs each `@agent.system_prompt(dynamic=True)` function when a run is given a message history, and
puts the new value where the history has a part with that function's ref (`dynamic_ref`): in place, or, for
`on_change='append'`, as a new statement when the value changed. A durable run cannot run the functions in
workflow code (they may do I/O), so the describe activity runs them once, when the run starts, with its deps and
prompt, and records their values (`AgentSpec.system_prompts`, `AgentSpec.dynamic_prompts`); what is here is a pure
function of those values and the history, so a replay rebuilds the same messages.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelRequestPart, SystemPromptPart

from ..shared._types import AgentSpec

__all__ = ["opening_parts", "revalued"]


def opening_parts(spec: AgentSpec, now: datetime) -> list[ModelRequestPart]:
    """The system prompt parts that open a new conversation, a dynamic one with its ref (as pydantic-ai's)."""
    dynamic = {d.index: d for d in spec.dynamic_prompts}
    parts: list[ModelRequestPart] = []
    for index, content in enumerate(spec.system_prompts):
        prompt = dynamic.get(index)
        parts.append(SystemPromptPart(content, timestamp=now) if prompt is None else
                     _dynamic_part(content, now, prompt.ref, prompt.context_id))
    return parts


def _dynamic_part(content: str, now: datetime, ref: str, context_id: str | None,
                  metadata: Any = None) -> SystemPromptPart:
    """A dynamic prompt's part, with `context_id` only when set.

    pydantic-ai before 2.68 has no such field, nor `on_change='append'`, which is what sets it: there the parts are
    built as that release builds them.
    """
    if context_id is None:
        return SystemPromptPart(content, timestamp=now, dynamic_ref=ref, metadata=metadata)
    return SystemPromptPart(content, timestamp=now, dynamic_ref=ref, metadata=metadata,  # type: ignore[call-arg,unused-ignore]
                            context_id=context_id)


def revalued(spec: AgentSpec, messages: list[ModelMessage], now: datetime) -> list[SystemPromptPart]:
    """Re-value, in place, the dynamic system prompt parts of a given history, as pydantic-ai does for a new run.

    As `reevaluate_dynamic_system_prompts`: a part whose ref is a recorded dynamic prompt gets its recorded value
    (each changed request replaced, never mutated); for an `on_change='append'` prompt the parts stay, and when
    the value differs from its latest part, the new statement is returned, for the request the run sends next.
    """
    prompts = {d.ref: d for d in spec.dynamic_prompts}
    if not prompts:
        return []
    latest: dict[str, SystemPromptPart] = {}
    for index, message in enumerate(messages):
        if not isinstance(message, ModelRequest):
            continue
        parts: list[ModelRequestPart] = []
        for part in message.parts:
            prompt = prompts.get(part.dynamic_ref or "") if isinstance(part, SystemPromptPart) else None
            if isinstance(part, SystemPromptPart) and prompt is not None:
                if prompt.context_id is not None:
                    latest[prompt.ref] = part
                else:
                    part = _dynamic_part(spec.system_prompts[prompt.index], now, prompt.ref, prompt.context_id,
                                         part.metadata)
            parts.append(part)
        if parts != message.parts:
            messages[index] = replace(message, parts=parts)
    return [_dynamic_part(spec.system_prompts[prompts[ref].index], now, ref, prompts[ref].context_id)
            for ref, part in latest.items() if spec.system_prompts[prompts[ref].index] != part.content]
