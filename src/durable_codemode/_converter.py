"""The data converter every client, worker and replayer of durable-codemode uses.

pydantic's payload converter, with pydantic-ai's process-wide cache of `TypeAdapter`s: Temporal builds a new
payload converter for each workflow instance, so without the shared cache every run (and every replay) rebuilt
the schemas of `RunInput`, `AgentSpec` and `ModelResponse`, measured at 250-360 ms of CPU per run. The wire
format is pydantic's JSON either way, so clients with the plain pydantic converter still interoperate.
"""

from __future__ import annotations

from pydantic_ai.durable_exec.temporal import PydanticAIPayloadConverter
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter

__all__ = ["DATA_CONVERTER", "is_compatible"]

DATA_CONVERTER = DataConverter(payload_converter_class=PydanticAIPayloadConverter)
"""Use this (or `durable_codemode.connect()`, or `CodeModePlugin`) for every client of durable-codemode runs."""


def is_compatible(converter: DataConverter) -> bool:
    """Whether `converter` decodes our payloads: pydantic's payload converter or a subclass of it."""
    return issubclass(converter.payload_converter_class, PydanticPayloadConverter)
