"""The data converter every client, worker and replayer of durable-codemode uses.

pydantic's payload converter, with pydantic-ai's process-wide cache of `TypeAdapter`s: Temporal builds a new
payload converter for each workflow instance, so without the shared cache every run (and every replay) rebuilt
the schemas of `RunInput`, `AgentSpec` and `ModelResponse`, measured at 250-360 ms of CPU per run. The wire
format is pydantic's JSON either way, so clients with the plain pydantic converter still interoperate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from pydantic_ai.durable_exec.temporal import PydanticAIPayloadConverter
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter

__all__ = ["DATA_CONVERTER", "is_compatible", "warm_up"]

DATA_CONVERTER = DataConverter(payload_converter_class=PydanticAIPayloadConverter)
"""Use this (or `durable_codemode.connect()`, or `CodeModePlugin`) for every client of durable-codemode runs."""


def is_compatible(converter: DataConverter) -> bool:
    """Whether `converter` decodes our payloads: pydantic's payload converter or a subclass of it."""
    return issubclass(converter.payload_converter_class, PydanticPayloadConverter)


def warm_up(converter: DataConverter, hints: Iterable[Any]) -> None:
    """Build the converter's cached `TypeAdapter`s for `hints` now, before a worker takes its first tasks.

    A cold worker that receives a burst of runs otherwise builds the same adapters in every workflow thread at
    once (the cache fills only when a build finishes): `RunInput`'s takes ~360 ms alone, and 30 threads
    contending for the GIL took over 2 s each, so 30 of the first 30 workflow tasks failed with Temporal's
    deadlock error (TMPRL1101) and were retried seconds later.
    """
    null = Payload(metadata={"encoding": b"json/plain"}, data=b"null")
    for hint in hints:
        with contextlib.suppress(Exception):  # `null` is no valid value: only the adapter's build matters
            converter.payload_converter.from_payloads([null], [hint])
