"""What decides a run's outcome on the worker: an answer checked as pydantic-ai would, and the run's end hooks.

- The output activity checks a response that may end the run with pydantic-ai's own output processing (the
  output type, output functions, output validators), on a one-step probe of the agent (`check_output`).
- The after-run activity gives the capabilities' `after_run` hooks the decided output (`after_run`), and the
  run-error activity gives their `on_run_error` hooks a failure of the run's body (`on_run_error`), each with the
  `RunContext` and `AgentRunResult` `agent.run()` would give them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from pydantic import TypeAdapter
from pydantic_ai import AgentRunResult, CallToolsNode, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage
from pydantic_graph import End

from .._pydantic_ai import agent_run_result, start_step
from ..shared._activity_io import OutputVerdict
from ..shared._errors import OutputChangedError
from ..shared._results import clip, jsonable
from ..workflow._fingerprints import OutputShape
from ._capabilities import probing, run_after_run, run_on_run_error
from ._probe import PROBE_PROFILE, Probed, last_prompt

if TYPE_CHECKING:
    from ._agent import CodeModeAgent

__all__ = ["after_run", "check_output", "on_run_error"]

_MARK = "durable-codemode: the output tool's return"


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


async def check_output(durable: CodeModeAgent, messages: list[ModelMessage], response: ModelResponse, *,
                       retries: int, deps: Any = None, model_settings: Mapping[str, Any] | None = None,
                       recorded: tuple[str, str] | None = None) -> OutputVerdict:
    """Check `response` as pydantic-ai's own run would: the output type, output functions, output validators.

    The agent runs for one step on a model that answers `response`: pydantic-ai validates it (and runs the
    validators, which may do I/O: this is an activity) and either ends with the output, or asks the model again
    with its retry request, which is what we return. The run's retry count is set first, so validators see the
    durable run's `ctx.retry`, and a rejection past the budget raises pydantic-ai's `UnexpectedModelBehavior`.

    `recorded`: the run's recorded output as (fingerprint, words) (`_fingerprints.OutputShape`). When the agent's
    output is another now (a deploy changed it) and it rejects the answer, the rejection is final
    (`OutputChangedError`): the run's model was offered the recorded output, so asking it again cannot help.
    """
    asked = 0
    current: OutputShape | None = None

    def answer(history: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal asked, current
        asked += 1
        if asked == 1:
            params = info.model_request_parameters
            current = OutputShape.of(info.output_tools, params.output_object, allows_text=info.allow_text_output,
                                     allows_image=params.allow_image_output)
            return response
        raise Probed(history, info)

    model = FunctionModel(answer, profile=PROBE_PROFILE)
    agent = durable.agent
    run_deps = await durable.build_deps(deps)
    try:
        with probing(agent):
            async with agent.iter(message_history=messages, model=model, deps=run_deps,
                                  model_settings=cast(ModelSettings | None, model_settings)) as run:
                start_step(run, output_retries=retries)
                node: Any = run.next_node
                while not isinstance(node, End):
                    if isinstance(node, CallToolsNode):  # its tool manager is the step's: count on it too
                        start_step(run, output_retries=retries)
                    node = await run.next(node)
    except Probed as probed:
        last = probed.messages[-1]
        assert isinstance(last, ModelRequest), "pydantic-ai asked again without a request"
        if recorded is not None and current is not None and current.fingerprint != recorded[0]:
            raise OutputChangedError(durable.name, recorded[1], current.summary(), _rejection(last)) from None
        return OutputVerdict(retry=last)
    assert run.result is not None
    return OutputVerdict(output=jsonable(run.result.output), **_closing(run.result))


def _rejection(retry: ModelRequest) -> str:
    """What pydantic-ai's retry request says was wrong with an answer, in a line (bounded)."""
    said = []
    for part in retry.parts:
        content = getattr(part, "content", None)
        if isinstance(content, str):
            said.append(content)
        elif isinstance(content, list):
            said += [f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" if isinstance(e, dict)
                     else str(e) for e in content]
    return clip("; ".join(said) or "rejected", 400)


def _closing(result: AgentRunResult[Any]) -> dict[str, Any]:
    """What ends a run's messages after its output (`OutputVerdict.closing`, `.output_tool`), as pydantic-ai left it.

    pydantic-ai answers an output tool's call with a last request (`'Final result processed.'`); which output tool
    gave the output is found with its own public `all_messages(output_tool_return_content=...)`.
    """
    last = result.all_messages()[-1]
    if not isinstance(last, ModelRequest):
        return {}
    try:
        marked = result.all_messages(output_tool_return_content=_MARK)[-1]
    except (ValueError, LookupError):  # no output tool gave the output
        return {"closing": last}
    tool = next((p.tool_name for p in marked.parts if isinstance(p, ToolReturnPart) and p.content == _MARK), None)
    return {"closing": last, "output_tool": tool}


async def after_run(durable: CodeModeAgent, override: str | None, messages: list[ModelMessage], output: Any,
                    usage: RunUsage, *, deps: Any = None) -> Any:
    """The run's output (JSON) after the capabilities' `after_run` hooks, which may replace it.

    They get what `agent.run()` gives them: the run's context (deps, history, usage, model) and an `AgentRunResult`
    whose `output` is the decided output rebuilt as the agent's output type, whose `all_messages()` is the run's
    history and whose `usage` its usage.
    """
    ctx = await _ending_context(durable, override, messages, usage, deps)
    typed = _adapter(durable.output_type).validate_python(output)
    return jsonable(await run_after_run(durable.agent, ctx, agent_run_result(typed, messages, usage)))


async def on_run_error(durable: CodeModeAgent, override: str | None, messages: list[ModelMessage], usage: RunUsage,
                       error: BaseException, *, deps: Any = None) -> Any:
    """The output (JSON) with which the capabilities' `on_run_error` hooks recover a failed run.

    They get what `agent.run()` gives them: the run's context (deps, history, usage, model) and the error
    (`run_failure`). What they raise propagates; `error` itself when none of them recovers the run.
    """
    ctx = await _ending_context(durable, override, messages, usage, deps)
    return jsonable(await run_on_run_error(durable.agent, ctx, error))


async def _ending_context(durable: CodeModeAgent, override: str | None, messages: list[ModelMessage],
                          usage: RunUsage, deps: Any) -> RunContext[Any]:
    """The `RunContext` a run's end hooks get (`after_run`, `on_run_error`): deps, history, usage, model."""
    return replace(durable.run_context(deps=await durable.build_deps(deps)), model=durable.resolve_model(override),
                   messages=list(messages), usage=usage, prompt=last_prompt(messages))
