"""What a run's recorded output is, as a short fingerprint and a line of words, to tell when a deploy changed it.

A run records its agent's output when it starts (`AgentSpec.output`) and offers the model that output to its end.
A worker whose agent now has another output (a deploy changed the output type, renamed a field, dropped the
structured output) cannot validate an answer made for the recorded one. The fingerprint tells the two apart
without the recorded definitions crossing the workflow boundary again: the model step (`worker/_model_step`)
offers the recorded output when the agent's differs, and the output activity refuses, by name, an answer that a
changed output rejects (`worker/_run_outcome`), where asking the model again could never help.

Pure functions of plain data: workflow code computes the recorded side (`recorded_output`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai.output import OutputObjectDefinition
from pydantic_ai.tools import ToolDefinition

from ..shared._types import OutputSpec

__all__ = ["OutputShape", "recorded_output"]

_SUMMARY_CHARS = 300
"""A shape's words are bounded: a large schema would otherwise be repeated into every error that names it."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def _fields(schema: Any) -> str:
    """`{a: integer, b?: string}`: a JSON schema's top-level properties (`?`: not required), in words."""
    if not isinstance(schema, dict):
        return "{}"
    required = set(schema.get("required") or ())
    props = schema.get("properties") or {}
    shown = []
    for name, prop in props.items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        if isinstance(prop, dict) and "$ref" in prop:
            kind = str(prop["$ref"]).rsplit("/", 1)[-1]
        shown.append(f"{name}{'' if name in required else '?'}: {kind}")
    return "{" + ", ".join(shown) + "}"


@dataclass(frozen=True)
class OutputShape:
    """What ends a run, as the model is offered it: output tools, an output object, text, images."""

    tools: tuple[tuple[str, str], ...]
    """Each output tool's name and its parameters' JSON schema (canonical JSON), sorted by name."""
    object_schema: str | None
    """The output object's JSON schema (native and prompted output), canonical JSON; `None`: none."""
    object_name: str | None
    allows_text: bool
    allows_image: bool

    @classmethod
    def of(cls, tools: Sequence[ToolDefinition], object_def: OutputObjectDefinition | None, *, allows_text: bool,
           allows_image: bool) -> OutputShape:
        """The shape of what pydantic-ai offers the model (a request's parameters, an `AgentInfo`)."""
        return cls(tools=tuple(sorted((t.name, _canonical(t.parameters_json_schema)) for t in tools)),
                   object_schema=_canonical(object_def.json_schema) if object_def is not None else None,
                   object_name=object_def.name if object_def is not None else None,
                   allows_text=allows_text, allows_image=allows_image)

    @property
    def fingerprint(self) -> str:
        """A short hash of the shape: equal for two agents whose answers validate the same way."""
        text = _canonical([self.tools, self.object_schema, self.allows_text, self.allows_image])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def summary(self) -> str:
        """The shape in words, e.g. `output tool final_result {city: string, country?: string}`; bounded."""
        said = [f"output tool {name} {_fields(json.loads(schema))}" for name, schema in self.tools]
        if self.object_schema is not None:
            said.append(f"output object {self.object_name or ''} {_fields(json.loads(self.object_schema))}".replace(
                "  ", " "))
        if self.allows_text and not self.tools and self.object_schema is None:
            said.append("text")
        elif self.allows_text:
            said.append("or text")
        if self.allows_image:
            said.append("or an image")
        text = ", ".join(said) or "nothing"
        return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def recorded_output(output: OutputSpec | None) -> OutputShape:
    """The shape of a run's recorded output (`AgentSpec.output`; `None`: text, as a `str` output with no validators)."""
    if output is None:
        return OutputShape(tools=(), object_schema=None, object_name=None, allows_text=True, allows_image=False)
    return OutputShape.of(output.tools, output.object_def, allows_text=output.allows_text,
                          allows_image=output.allows_image)
