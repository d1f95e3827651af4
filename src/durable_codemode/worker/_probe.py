"""The worker's probing runs of an agent: pydantic-ai asked what it would send, or what it makes of an answer.

A run's start (`_describe`) and an answer's check (`_run_outcome`) run the agent on a `FunctionModel` of the
worker's, with the hooks that act once per run masked (`_capabilities.probing`), and stop the run at the model
request they were started for by raising `Probed` from that model.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.profiles import ModelProfile

__all__ = ["PROBE_PROFILE", "Probed", "RawProbeModel", "last_prompt"]

PROBE_PROFILE = ModelProfile(supports_tools=True, supports_json_schema_output=True, supports_json_object_output=True)
"""The profile of the `FunctionModel`s that ask pydantic-ai about the agent: one that takes every output mode, so
the agent's own `NativeOutput` is not refused by the probe (the run's real model decides for itself)."""


class RawProbeModel(FunctionModel):
    """The describe probe's model: it sees the history as the run has it, not as rendered for a model.

    `Model.prepare_messages` renders parts for sending (an appending system prompt as its `<pyai:context>`
    element); the run records the parts themselves, and pydantic-ai renders them at each request (the model step).
    """

    def prepare_messages(self, messages: list[ModelMessage],
                         model_request_parameters: ModelRequestParameters | None = None) -> list[ModelMessage]:
        return messages


class Probed(Exception):
    """Ends a probing run of the agent at the model request it was started for (its work is done by then)."""

    def __init__(self, messages: list[ModelMessage], info: AgentInfo) -> None:
        super().__init__("probe")
        self.messages, self.info = messages, info


def last_prompt(messages: list[ModelMessage]) -> Any:
    """The run's latest user prompt (`ctx.prompt`), as pydantic-ai keeps it for the run."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    return part.content
    return None
