"""The run loop's semantics (`workflow/_loop.py`) against pydantic-ai's own `agent.run()`, with no Temporal server.

Each test scripts a model with pydantic-ai's `FunctionModel` (the scripted model), runs the agent with
`agent.run()`, and feeds the same responses to `RunLoop`: what it decides (which calls run, when the output is
checked, what answers each call, when a budget runs out, what the run used) must be what pydantic-ai did.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RunUsage, UsageLimits

from durable_codemode.shared._activity_io import OutputVerdict
from durable_codemode.shared._types import OutputSpec
from durable_codemode.workflow._loop import NOT_RUN, RunLoop, check_counted, count_response, unknown_tool

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Answer(BaseModel):
    n: int


def _scripted(*responses: ModelResponse, asked: list[ModelMessage] | None = None,
              ) -> tuple[FunctionModel, list[AgentInfo]]:
    """A `FunctionModel` that answers `responses` in turn, and the `AgentInfo` of each request it got.

    `asked` collects the request each answer answers.
    """
    seen: list[AgentInfo] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        if asked is not None:
            asked.append(messages[-1])
        return responses[len(seen) - 1]

    return FunctionModel(answer), seen


def _loop_for(agent: Agent[Any, Any], info: AgentInfo) -> RunLoop:
    """A `RunLoop` for `agent`, its output spec as a run records it from what pydantic-ai offered the model."""
    output = None
    if info.output_tools:
        output = OutputSpec(mode="tool", tools=list(info.output_tools), allows_text=info.allow_text_output,
                            end_strategy=agent.end_strategy)
    return RunLoop(output, None, lambda: NOW)


def _answers(request: ModelMessage) -> list[tuple[str, str | None, Any]]:
    """What a request answers: each part's (tool call id, tool name, content), in order."""
    assert isinstance(request, ModelRequest)
    return [(getattr(p, "tool_call_id", ""), getattr(p, "tool_name", None), getattr(p, "content", None))
            for p in request.parts]


def _output_parts(request: ModelMessage, output_tool: str) -> OutputVerdict:
    """The output activity's verdict for an accepted output tool call: pydantic-ai's answer to that call only."""
    assert isinstance(request, ModelRequest)
    return OutputVerdict(output="ok", closing=ModelRequest(
        parts=[p for p in request.parts if getattr(p, "tool_name", None) == output_tool]))


def _lookup() -> str:
    return "x"


def _said(part: Any) -> str:
    """What a retry part tells the model."""
    return part.model_response() if isinstance(part, RetryPromptPart) else str(part.content)


def _both_calls() -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("lookup", {}, tool_call_id="f1"),
                                ToolCallPart("final_result", {"n": 1}, tool_call_id="o1")])


def _agent_with_lookup(end_strategy: Any) -> tuple[Agent[None, Answer], list[AgentInfo], list[str]]:
    model, seen = _scripted(_both_calls())
    agent = Agent(model, output_type=Answer, end_strategy=end_strategy)
    ran: list[str] = []

    @agent.tool_plain
    def lookup() -> str:
        ran.append("lookup")
        return "looked up"

    return agent, seen, ran


async def test_early_checks_the_output_first_and_answers_the_function_call_as_not_run() -> None:
    agent, seen, ran = _agent_with_lookup("early")
    result = await agent.run("go")
    loop = _loop_for(agent, seen[0])
    reading = loop.read(_both_calls())
    assert reading.check_first and not reading.maybe_text
    assert [c.tool_name for c in reading.functions] == ["lookup"]
    assert ran == []  # pydantic-ai did not run it either: the output was checked first and ended the run
    closing = loop.closing(reading.calls, _output_parts(result.all_messages()[-1], "final_result"), [])
    assert closing is not None
    # The same answers; ours in the order of the response's calls, pydantic-ai's (2.78) output tool's first. Runs
    # have recorded this order in their results, so it is kept.
    assert sorted(_answers(closing)) == sorted(_answers(result.all_messages()[-1]))
    assert _answers(closing)[0] == ("f1", "lookup", NOT_RUN)


async def test_exhaustive_runs_the_function_calls_before_the_output() -> None:
    agent, seen, ran = _agent_with_lookup("exhaustive")
    result = await agent.run("go")
    loop = _loop_for(agent, seen[0])
    reading = loop.read(_both_calls())
    assert not reading.check_first
    assert ([c.tool_name for c in reading.functions], [c.tool_name for c in reading.output_calls]) == (
        ["lookup"], ["final_result"])
    assert ran == ["lookup"]
    lookup_call = reading.functions[0]
    answered = [loop.returned(lookup_call, "looked up")]
    assert loop.suppressed_output(list(answered), reading.output_calls) is None  # the call did not ask for a retry
    closing = loop.closing(reading.calls, _output_parts(result.all_messages()[-1], "final_result"), list(answered))
    assert closing is not None and _answers(closing) == _answers(result.all_messages()[-1])


async def test_text_ends_a_run_without_output_tools_and_is_checked_with_them() -> None:
    thinking = ModelResponse(parts=[TextPart("let me look"), ToolCallPart("lookup", {}, tool_call_id="f1")])
    done = ModelResponse(parts=[TextPart("done")])
    model, seen = _scripted(thinking, done)
    agent = Agent(model)
    agent.tool_plain(name="lookup")(_lookup)
    result = await agent.run("go")
    loop = _loop_for(agent, seen[0])
    first, last = loop.read(thinking), loop.read(done)
    assert (first.answer, [c.tool_name for c in first.functions]) == (None, ["lookup"])  # text beside a call: not yet
    assert last.answer == result.output == "done" and len(seen) == 2

    structured, seen_structured = _scripted(ModelResponse(parts=[TextPart("plain")]),
                                            ModelResponse(parts=[ToolCallPart("final_result", {"n": 2})]))
    typed = Agent(structured, output_type=Answer)
    assert (await typed.run("go")).output == Answer(n=2) and len(seen_structured) == 2  # the text was refused
    reading = _loop_for(typed, seen_structured[0]).read(ModelResponse(parts=[TextPart("plain")]))
    assert reading.check_first and reading.answer is None  # the output activity (pydantic-ai's own) decides


async def test_output_validator_retries_then_fails_as_pydantic_ai_does() -> None:
    from durable_codemode.worker._agent import CodeModeAgent
    from durable_codemode.worker._run_outcome import check_output

    bad = ModelResponse(parts=[ToolCallPart("final_result", {"n": -1}, tool_call_id="o1")])
    asked: list[ModelMessage] = []
    model, seen = _scripted(bad, bad, bad, asked=asked)
    agent = Agent(model, output_type=Answer, retries={"output": 1}, name="validated")

    @agent.output_validator
    def positive(answer: Answer) -> Answer:
        if answer.n < 0:
            raise ModelRetry("n must be positive")
        return answer

    with pytest.raises(UnexpectedModelBehavior) as theirs:
        await agent.run("go")
    retries_asked = len(seen) - 1
    durable = CodeModeAgent(agent, name="validated", code_mode=False)
    loop = _loop_for(agent, seen[0])
    messages: list[ModelMessage] = [ModelRequest.user_text_prompt("go")]
    told: list[str] = []
    with pytest.raises(UnexpectedModelBehavior) as ours:
        for _ in range(retries_asked + 2):  # bounded: a loop that never counts must fail here, not hang
            reading = loop.read(bad)
            assert reading.check_first
            verdict = await check_output(durable, messages, loop.output_candidate(bad, reading.functions),
                                         retries=loop.output_retries)
            loop.output_checked(verdict, counts=not reading.maybe_text)
            assert verdict.retry is not None
            told += [_said(p) for p in verdict.retry.parts]
            messages += [bad, loop.request(list(verdict.retry.parts))]
    assert str(ours.value) == str(theirs.value)
    assert (len(told), loop.output_retries) == (retries_asked, retries_asked)
    assert told == [_said(p) for request in asked[1:] for p in request.parts]
    assert all("n must be positive" in t for t in told)


async def test_unknown_tool_is_a_retry_for_the_same_call() -> None:
    wrong = ModelResponse(parts=[ToolCallPart("nope", {}, tool_call_id="u1")])
    model, seen = _scripted(wrong, ModelResponse(parts=[TextPart("ok")]))
    agent = Agent(model)
    agent.tool_plain(name="lookup")(_lookup)
    result = await agent.run("go")
    theirs = result.all_messages()[2]
    assert isinstance(theirs, ModelRequest)
    (their_part,) = theirs.parts
    assert isinstance(their_part, ToolReturnPart) and result.output == "ok" and len(seen) == 2  # asked again
    loop = _loop_for(agent, seen[0])
    (call,) = loop.read(wrong).functions
    ours = loop.retried(call, unknown_tool(call, seen[0].function_tools), "unknown_tool")
    assert their_part.retry is not None and ours.retry is not None
    assert (ours.tool_call_id, ours.tool_name, ours.outcome, ours.retry.cause) == (
        their_part.tool_call_id, their_part.tool_name, their_part.outcome, their_part.retry.cause)
    # The words differ (ours: "Unknown tool 'nope'; the tools are: lookup."), and runs recorded them: both name
    # the wrong tool and the tools there are.
    assert "'nope'" in str(ours.content) and "lookup" in str(ours.content) and "lookup" in str(their_part.content)


async def test_usage_is_counted_and_limited_as_agent_run_counts_it() -> None:
    call = ModelResponse(parts=[ToolCallPart("lookup", {}, tool_call_id="f1")])
    done = ModelResponse(parts=[TextPart("done " * 50)])
    model, _ = _scripted(call, done)
    agent = Agent(model)
    agent.tool_plain(name="lookup")(_lookup)
    result = await agent.run("go")
    usage = RunUsage()
    for message in result.all_messages():
        if isinstance(message, ModelResponse):
            count_response(usage, message)
    theirs = result.usage
    assert (usage.requests, usage.input_tokens, usage.output_tokens) == (
        theirs.requests, theirs.input_tokens, theirs.output_tokens)

    limit = theirs.total_tokens - 1
    model_again, _ = _scripted(call, done)
    with pytest.raises(UsageLimitExceeded) as their_error:
        await agent.run("go", model=model_again, usage_limits=UsageLimits(total_tokens_limit=limit))
    with pytest.raises(UsageLimitExceeded) as our_error:
        check_counted(UsageLimits(total_tokens_limit=limit), usage)
    assert str(our_error.value) == str(their_error.value)
