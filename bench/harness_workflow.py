"""pydantic-ai-harness's code mode on Temporal, set up as its docs say, for `bench/harness_bench.py`.

This module runs only in the harness's own Python (`bench/harness_side.py` imports it there):
pydantic-ai-harness 0.62 pins `pydantic-ai-slim==2.62.0`, which cannot share an environment with
durable-codemode (`pydantic-ai-slim>=2.68`), so nothing here imports `durable_codemode`.

What it holds, following the harness's code-mode README ("Temporal durability") and its own test
(`tests/code_mode/test_temporal.py` in pydantic/pydantic-ai):

- one named `Agent` built at module level (Temporal needs its activities at import time), with the
  benchmark's tool `async def get(i: int) -> int` in a `FunctionToolset` with a stable id, and the
  capabilities `CodeMode()` and `TemporalDurability()`;
- a `FunctionModel` that makes one `run_code` call whose code is the run's prompt (the parent sends
  `run_bench.snippet(kind, n)`, so both runtimes run the very same program), then answers with the
  `run_code` result as text;
- `HarnessWorkflow`, which calls the plain agent from workflow code, as the pydantic-ai Temporal guide does.

The workflow module must be importable (a workflow class in `__main__` fails sandbox validation), hence
this file apart from `harness_side.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets.function import FunctionToolset
from pydantic_ai_harness import CodeMode
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityConfig

__all__ = ["AGENT", "MAX_CALLS", "HarnessInput", "HarnessOutput", "HarnessWorkflow"]

MAX_CALLS = 100_000
"""`CodeMode.max_tool_calls` and Monty's `max_suspensions`: the defaults (100 calls per `run_code`, 1,000
suspensions per session) stop a 200-call program, and the benchmark measures speed, not budgets."""

#: The same start-to-close timeout and retry policy as a durable-codemode tool's defaults (and the floor's).
_TOOL_CONFIG = ActivityConfig(
    start_to_close_timeout=timedelta(seconds=30),
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=10), maximum_attempts=3),
)


async def get(i: int) -> int:
    """Get the value of item i."""
    return i


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First request: one `run_code` call running the prompt. Second: the `run_code` result, as text."""
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart) and part.tool_name == "run_code":
                    return ModelResponse(parts=[TextPart(content=str(part.content))])
    prompt = next(p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
                  if p.part_kind == "user-prompt")
    return ModelResponse(parts=[ToolCallPart(tool_name="run_code", args={"code": prompt}, tool_call_id="bench-1")])


AGENT = Agent(
    FunctionModel(_model),
    name="bench-harness",
    instructions="Use run_code.",
    toolsets=[FunctionToolset(tools=[get], id="bench")],
    capabilities=[
        CodeMode(max_tool_calls=MAX_CALLS, resource_limits={"max_suspensions": MAX_CALLS}),
        TemporalDurability(toolset_activity_config={"bench": _TOOL_CONFIG}),
    ],
)


@dataclass(kw_only=True)
class HarnessInput:
    """The program to run (`run_bench.snippet(kind, n)`)."""

    code: str


@dataclass(kw_only=True)
class HarnessOutput:
    """The agent's answer and how many nested calls its `run_code` made (from the result's metadata)."""

    output: str
    nested_calls: int


@workflow.defn(name="bench.harness")
class HarnessWorkflow:
    """Runs `AGENT` on the program: 2 model activities and one activity per nested call."""

    @workflow.run
    async def run(self, input: HarnessInput) -> HarnessOutput:
        result = await AGENT.run(input.code)
        nested = 0
        for message in result.all_messages():
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    if isinstance(part, ToolReturnPart) and part.tool_name == "run_code":
                        nested += len((part.metadata or {}).get("tool_calls", {}))
        return HarnessOutput(output=str(result.output), nested_calls=nested)
