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

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelRequestPart, SystemPromptPart

from .._types import AgentSpec

__all__ = ["opening_parts", "revalued"]


def opening_parts(spec: AgentSpec, now: datetime) -> list[ModelRequestPart]:
    """The system prompt parts that open a new conversation, a dynamic one with its ref (as pydantic-ai's)."""
    dynamic = {d.index: d for d in spec.dynamic_prompts}
    parts: list[ModelRequestPart] = []
    for index, content in enumerate(spec.system_prompts):
        prompt = dynamic.get(index)
        parts.append(SystemPromptPart(content, timestamp=now) if prompt is None else
                     SystemPromptPart(content, timestamp=now, dynamic_ref=prompt.ref, context_id=prompt.context_id))
    return parts


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
                    part = SystemPromptPart(spec.system_prompts[prompt.index], timestamp=now, dynamic_ref=prompt.ref,
                                            metadata=part.metadata, context_id=prompt.context_id)
            parts.append(part)
        if parts != message.parts:
            messages[index] = replace(message, parts=parts)
    return [SystemPromptPart(spec.system_prompts[prompts[ref].index], timestamp=now, dynamic_ref=ref,
                             context_id=prompts[ref].context_id)
            for ref, part in latest.items() if spec.system_prompts[prompts[ref].index] != part.content]
