"""Benchmark tasks: what a bundled app is asked to do, how to seed it, and the oracle that grades the end state.

A `Task` is a recipe; `Task.setup(workdir, n)` makes an `Instance`: the app's SQLite file(s) seeded
deterministically for that N, the prompt, and the agents for both modes. The benchmark (`codemode bench`) and
the tests run an instance on a real Temporal server and then call `Instance.check(reply)`, which returns the
oracle's problems (an empty list is a pass).

Both modes have a scripted model that plays the model's part offline, named as such in every output:
- code mode on: `scripted_model(RunCode(program), answer)`; the model writes the program once;
- code mode off ("tool calling"): `tool_calling_model(policy)`; the model sees every tool result and, each turn,
  issues every call it can already decide from what it has seen, batched in one response as real models do.
With a real model (`model="openai:..."`) the same instance runs with that model in either mode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from durable_codemode import CodeModeAgent
from durable_codemode.testing import last_result

__all__ = [
    "MAX_BATCH",
    "SCALING_SIZES",
    "Call",
    "Instance",
    "Mode",
    "Seen",
    "Task",
    "as_json",
    "numbers_in",
    "tool_calling_model",
]

Mode = Literal["on", "off"]
"""Code mode on (the model writes programs) or off (the model calls each tool directly)."""

SCALING_SIZES = (5, 20, 50, 100, 200)
"""The N of the scaling tasks."""

MAX_BATCH = 10
"""At most this many tool calls per response of a scripted tool-calling model: real models batch parallel calls,
but a handful at a time, not hundreds."""


@dataclass(frozen=True)
class Call:
    """One direct tool call the scripted tool-calling model decides to make."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Seen:
    """One tool call the model made earlier in the run and what came back (a value, or an error message)."""

    tool: str
    args: dict[str, Any]
    result: Any
    ok: bool


Policy = Callable[[list[Seen]], "Sequence[Call] | str"]
"""What the scripted tool-calling model does next, given every call so far: more calls, or the final answer.

It must be a pure function of what it has seen (the same history gives the same answer, also on retries and
after continue-as-new), and must not repeat a call it has already made unless it means to."""


def _seen(messages: list[ModelMessage]) -> list[Seen]:
    calls: dict[str, ToolCallPart] = {}
    seen: list[Seen] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    calls[part.tool_call_id] = part
        elif isinstance(message, ModelRequest):
            for rpart in message.parts:
                if isinstance(rpart, ToolReturnPart) and rpart.tool_call_id in calls:
                    call = calls[rpart.tool_call_id]
                    ok = rpart.outcome == "success"
                    seen.append(Seen(tool=call.tool_name, args=call.args_as_dict(), result=rpart.content, ok=ok))
    return seen


def tool_calling_model(policy: Policy, *, name: str) -> FunctionModel:
    """A scripted model for code mode off: each turn, the calls `policy` decides from every result seen so far.

    Args:
        policy: See `Policy`. Only its first `MAX_BATCH` calls are made in a turn; the rest it decides again next
            turn, from what it has seen by then.
        name: The model name runs record; say "scripted" in it (e.g. `scripted-tool-calling-cart`).

    """

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        step = policy(_seen(messages))
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)], model_name=name)
        if not step:
            raise RuntimeError(f"{name}: the policy returned no calls and no answer on turn {turn + 1}")
        return ModelResponse(
            parts=[
                ToolCallPart(call.tool, dict(call.args), tool_call_id=f"call_{turn}_{i}")
                for i, call in enumerate(step[:MAX_BATCH])
            ],
            model_name=name,
        )

    return FunctionModel(respond, model_name=name)


class Instance(Protocol):
    """One task at one N, seeded and ready to run."""

    prompt: str
    """What the user asks; the same in both modes."""

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The app's agent over this instance's store(s): `model`, or the mode's scripted model when `None`.

        The agent's name is the app's (e.g. `cart`); for a task over two apps, the task's own name.
        """
        ...

    def check(self, reply: str) -> list[str]:
        """The oracle: the problems with the end state and with the numbers in `reply`; `[]` means correct."""
        ...

    def duplicate_effects(self) -> int:
        """How many side effects ran more than once across this instance's stores (0 is correct)."""
        ...


@dataclass(frozen=True)
class Task:
    """A benchmark task of one app (or two)."""

    name: str
    """E.g. `cart.remove-over-50`; unique across the bundled tasks."""
    apps: tuple[str, ...]
    kind: Literal["scaling", "long"]
    sizes: tuple[int, ...]
    """The N it runs at: `SCALING_SIZES` for scaling tasks; the record counts for long-horizon ones."""
    setup: Callable[[Path, int], Instance]
    """Seed the app(s) in `workdir` for N (deterministic: the same N gives the same data) and return the instance."""
    description: str = ""


def numbers_in(reply: str) -> list[str]:
    """The numbers in a reply as written (`$1,234.56` → `1234.56`, `17` → `17`), for oracles to compare."""
    out: list[str] = []
    token = ""
    for ch in reply + " ":
        if ch.isdigit() or (ch in ".," and token):
            token += ch
        else:
            if token:
                out.append(token.rstrip(".,").replace(",", ""))
            token = ""
    return out


def as_json(value: Any) -> str:
    """`value` as compact JSON, for oracle messages."""
    return json.dumps(value, sort_keys=True, default=str)


def summary_answer(doing: str, reply: Callable[[dict[str, Any]], str]) -> Callable[[list[ModelMessage]], str]:
    """The scripted code-mode model's final answer: `reply(summary)` of the dict its program returned.

    When the program was rejected (a retry prompt: a real model would fix the code, the script cannot) or failed,
    the answer says so instead, as "I could not {doing}: ...", which every oracle fails.
    """

    def answer(messages: list[ModelMessage]) -> str:
        seen: Any = last_result(messages)
        if not isinstance(seen, dict):
            return f"I could not {doing}: my program was rejected ({seen})."
        summary = seen.get("result")
        if not isinstance(summary, dict):
            return f"I could not {doing}: {seen.get('error', seen)}."
        return reply(summary)

    return answer
