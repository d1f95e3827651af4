"""What a run's model responses mean, as `agent.run()` reads them: the loop's semantics, without Temporal.

The run workflow (`_run`) makes the model requests, tool calls, output checks and timers; this module decides
what each of them means, from pydantic-ai message objects and plain data:

- what a response asks for (`RunLoop.read`): a final text answer, a retry for an empty answer, an output check
  before or after its function calls (pydantic-ai's `end_strategy`), and which calls run here;
- the parts of the next request (`RunLoop.request`, `.returned`, `.retried`, `.closing`, `.restarted`), in the
  order of the response's calls, as pydantic-ai answers them;
- the retry budgets (output retries, each tool's retries in a row) and the run's usage (`count_response`,
  `check_counted`).

No `temporalio` import, not even for type checking: what is decided here is unit-tested against pydantic-ai's own
`agent.run()` for the same responses (`tests/test_run_loop.py`), and the strings copied from pydantic-ai are pinned
against the installed release (`tests/test_compat.py`). What a run records is built through `clock` (the
workflow's `workflow.now`), called exactly where the workflow called it before, so old histories replay unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryFeedbackPart,
    RetryInfo,
    TextPart,
    ToolCallPart,
    ToolRetryCause,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RunUsage, UsageLimits

from ..shared._activity_io import OutputVerdict
from ..shared._names import RUN_CODE_TOOL
from ..shared._results import preview
from ..shared._types import OutputSpec

__all__ = [
    "NOT_RUN",
    "NO_OUTPUT",
    "OUTPUT_SUPPRESSED",
    "RESTARTED",
    "Reading",
    "RunLoop",
    "check_counted",
    "copied",
    "count_response",
    "model_requests_exhausted",
    "run_code_args",
    "unknown_tool",
    "with_note",
]

NOT_RUN = "Tool not executed - a final result was already processed."
"""What a function call of a run's final response returns when the output ended the run first: pydantic-ai's words
(`TOOL_SKIPPED_FINAL_ALREADY_PROCESSED`), so the conversation's last response has an answer for each of its calls.
Pinned against the installed pydantic-ai in `tests/test_compat.py`."""

NO_OUTPUT = "Your response had neither text nor a tool call; answer in text or call a tool."
"""The retry feedback for a response with neither text nor a tool call, when the agent has no output spec (ours:
pydantic-ai words it otherwise). Recorded in histories: changing it changes what old runs' models were told."""

OUTPUT_SUPPRESSED = "Output tool not used: a function tool call of the same response asked for a retry first."
"""What an output tool call is answered with when a function call of its response asked for a retry (ours)."""

RESTARTED = {"error": "not run: the run was restarted first"}
"""What a call of a response returns when a snippet of the same response ended the workflow run first."""


def count_response(usage: RunUsage, response: ModelResponse) -> None:
    """Add one model request, and its usage, to the run's, with the failed attempts it records (they were billed).

    As `agent.run()` counts them: a `ModelFallback` or `FallbackModel` moved on from them.
    """
    usage.incr(response.usage)
    usage.requests += 1
    for attempt in response.failed_attempts or ():
        if attempt.usage is not None:
            usage.incr(attempt.usage)


def check_counted(limits: UsageLimits, usage: RunUsage) -> None:
    """Whether a run may start another tool call, now that its tools' sub-agent runs are counted in its usage.

    Only a tool's own model use (`_tool_usage`) can take a run past its request or token limits between two
    model requests (each request checks them before and after), so an ordinary run never fails here; one whose
    programs delegate in a loop stops at the first call past a limit instead of at its next model request.

    Raises:
        UsageLimitExceeded: past a limit (the workflow fails the run with its message, not retried).

    """
    limits.check_tokens(usage)
    if limits.request_limit is not None and usage.requests > limits.request_limit:
        raise UsageLimitExceeded(f"Exceeded the request_limit of {limits.request_limit} (requests={usage.requests}), "
                                 "counting the requests of the run's tools' own agent runs")


def copied(usage: RunUsage | None) -> RunUsage:
    """A run's starting usage (`RunInput.usage`), as a copy the run may count into: the input itself is carried on."""
    return RunUsage() if usage is None else replace(usage, details=dict(usage.details))


def model_requests_exhausted(usage: RunUsage, max_model_requests: int) -> str | None:
    """Why the run may make no more model requests (`SnippetLimits.max_model_requests`), or `None` if it may."""
    if usage.requests < max_model_requests:
        return None
    return (f"the run made {usage.requests} model requests, its limit (SnippetLimits.max_model_requests); the model "
            "may be looping. Raise the limit if the task needs more.")


def with_note(messages: list[ModelMessage], note: str, now: datetime) -> list[ModelMessage]:
    """`messages` with `note` added to the last request, for the model to read with the tool results."""
    last = messages[-1]
    if not isinstance(last, ModelRequest):
        return messages
    return [*messages[:-1], ModelRequest(parts=[*last.parts, UserPromptPart(note, timestamp=now)],
                                         instructions=last.instructions, timestamp=last.timestamp)]


def run_code_args(call: ToolCallPart) -> tuple[dict[str, Any], str | None]:
    """A `run_code` call's arguments (`{}` when not JSON), and why the model must call it again, or `None`: valid."""
    try:
        args = call.args_as_dict()
    except ValueError:
        args = {}
    code, restart = args.get("code"), args.get("restart", False)
    if not isinstance(code, str) or not isinstance(restart, bool) or set(args) - {"code", "restart"}:
        return args, f"run_code takes {{'code': str, 'restart': bool (optional)}}; got {preview(call.args)}"
    return args, None


def unknown_tool(call: ToolCallPart, model_tools: Sequence[ToolDefinition]) -> str:
    """What a direct call of a tool the model was not offered is told (a retry, as in pydantic-ai; our words)."""
    known = sorted(t.name for t in model_tools)
    return f"Unknown tool {call.tool_name!r}; the tools are: {', '.join(known)}."


@dataclass(frozen=True)
class Reading:
    """What one model response asks the run to do (`RunLoop.read`)."""

    text: str
    """The response's text parts, joined (the turn's record)."""
    calls: list[ToolCallPart]
    """Every tool call of the response, in its order (each needs an answer in the next request)."""
    functions: list[ToolCallPart]
    """The calls that run here (`run_code`, direct function tools): all of them without an output spec."""
    output_calls: list[ToolCallPart]
    """The output tool calls, checked after the functions ran (`end_strategy` graceful/exhaustive); empty when the
    output is checked first (`check_first`)."""
    answer: str | None = None
    """The run's output: the text of a response without calls, when the agent has no output spec."""
    empty: bool = False
    """The response has neither text nor calls and the agent has no output spec: the model is asked again."""
    check_first: bool = False
    """Check the output before running the functions: no functions, or `end_strategy='early'` with an output call
    or structured text."""
    maybe_text: bool = False
    """The output checked first is text beside function calls: an answer only if valid, and a rejection neither
    counts against the output retries nor is told to the model (the function calls run instead)."""


@dataclass
class RunLoop:
    """The run's loop state between model responses: retry budgets, and how the next request is built.

    `clock` is the workflow's clock (`workflow.now`): each part is stamped when the workflow builds it.
    """

    output: OutputSpec | None
    """The agent's recorded output spec (`None`: a text answer ends the run)."""
    instructions: str | None
    """The recorded instructions every request carries."""
    clock: Callable[[], datetime]
    output_retries: int = 0
    """Output retries used (`ctx.retry` of output validators), carried across continue-as-new."""
    tool_retries: dict[str, int] = field(default_factory=dict)
    """Retries in a row per directly called tool, carried across continue-as-new."""

    def read(self, response: ModelResponse) -> Reading:
        """What `response` asks for: an answer, a retry, an output check, function calls (in pydantic-ai's order).

        With an output spec, pydantic-ai's own output processing (the output activity) decides what ends the run;
        the response's function calls (`run_code`, direct tools) run here.
        """
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        out = self.output
        if out is None and not calls:
            return Reading(text, calls, [], [], answer=text or None, empty=not text)
        functions = calls if out is None else [c for c in calls if c.tool_name not in out.tool_names]
        output_calls = [c for c in calls if c not in functions]
        if out is not None and (not functions or (out.end_strategy == "early" and (
                output_calls or (out.structured_text and text)))):
            # Text beside function calls is an answer only if it is a valid one (`early`, as in pydantic-ai).
            return Reading(text, calls, functions, [], check_first=True,
                           maybe_text=bool(functions) and not output_calls)
        return Reading(text, calls, functions, output_calls)

    def output_candidate(self, response: ModelResponse, functions: list[ToolCallPart]) -> ModelResponse:
        """What the output activity checks: `response` without the calls that run here."""
        run_here = {id(c) for c in functions}
        return replace(response, parts=[p for p in response.parts if id(p) not in run_here])

    def output_checked(self, verdict: OutputVerdict, *, counts: bool) -> None:
        """Count a rejected output against the output retries (unless `counts` is false: text beside calls)."""
        if verdict.retry is not None and counts:
            self.output_retries += 1

    def hook_retry(self, retry: ModelRequest) -> ModelRequest:
        """The next request when a model-request hook asked for a retry (`ModelRetry`); it counts as an output retry."""
        self.output_retries += 1
        return self.request(list(retry.parts))

    def no_output(self) -> ModelRequest:
        """The next request for a response with neither text nor calls (`Reading.empty`)."""
        return self.request([RetryFeedbackPart(NO_OUTPUT, retry=RetryInfo("no_output"))])

    def suppressed_output(self, parts: list[ModelRequestPart],
                          output_calls: list[ToolCallPart]) -> OutputVerdict | None:
        """The verdict on output calls checked after the function calls ran, if one of those asked for a retry.

        As in pydantic-ai, the output is then not used and the model hears why; `None`: the output is checked.
        """
        if not any(isinstance(p, ToolReturnPart) and p.outcome == "retried" for p in parts):
            return None
        return OutputVerdict(retry=ModelRequest(parts=[
            self.retried(c, OUTPUT_SUPPRESSED, "model_retry") for c in output_calls]))

    def closing(self, calls: list[ToolCallPart], verdict: OutputVerdict,
                answered: list[ModelRequestPart]) -> ModelRequest | None:
        """The request pydantic-ai ends a run's messages with once `verdict` gave the output, or `None` (text).

        It answers the final response's calls: the output tool's (`verdict.closing`, from the output activity),
        the function calls that ran (`answered`), and the others as not run (`NOT_RUN`), so the conversation can be
        continued. Verdicts recorded before `closing` existed add nothing.
        """
        if verdict.closing is None:
            return None
        parts = [*answered, *verdict.closing.parts]
        done = {getattr(p, "tool_call_id", None) for p in parts}
        parts += [self.returned(c, NOT_RUN) for c in calls if c.tool_call_id not in done]
        return replace(verdict.closing, parts=self.in_call_order(calls, parts))

    def restarted(self, calls: list[ToolCallPart], parts: list[ModelRequestPart]) -> ModelRequest:
        """The last request of a workflow run a snippet ended (continue-as-new): every call answered, in order."""
        answered = {getattr(p, "tool_call_id", None) for p in parts}
        parts = [*parts, *(self.returned(c, dict(RESTARTED)) for c in calls if c.tool_call_id not in answered)]
        return self.request(self.in_call_order(calls, parts))

    def tool_succeeded(self, tool: str) -> None:
        """A direct call of `tool` returned: its retries in a row start again."""
        self.tool_retries.pop(tool, None)

    def tool_retried(self, tool: str, max_retries: int | None) -> str | None:
        """Count one retry of a direct call of `tool`: past its budget, the run's failure message, else `None`.

        As pydantic-ai's `UnexpectedModelBehavior` for a tool past its retries (our words). `max_retries` `None`:
        recorded before the budget was, unbounded, as it ran.
        """
        if max_retries is None:
            return None
        used = self.tool_retries.get(tool, 0)
        if used >= max_retries:
            return (f"Tool {tool!r} exceeded max retries count of {max_retries}: the model was asked to retry it "
                    f"{used} times in a row. Raise Agent(retries=...) or the tool's max_retries if it needs more.")
        self.tool_retries[tool] = used + 1
        return None

    def request(self, parts: list[ModelRequestPart]) -> ModelRequest:
        """The next request to the model, with the recorded instructions."""
        return ModelRequest(parts=parts, instructions=self.instructions, timestamp=self.clock())

    def returned(self, call: ToolCallPart, content: Any) -> ToolReturnPart:
        """Answer `call` with `content` (pydantic-ai's tool return)."""
        return ToolReturnPart(tool_name=call.tool_name, content=content, tool_call_id=call.tool_call_id,
                              timestamp=self.clock())

    def retried(self, call: ToolCallPart, message: str, cause: ToolRetryCause) -> ToolReturnPart:
        """Answer `call` with a request to try again (pydantic-ai's retried tool return)."""
        return ToolReturnPart(tool_name=call.tool_name, content=message, tool_call_id=call.tool_call_id,
                              timestamp=self.clock(), outcome="retried", retry=RetryInfo(cause))

    @staticmethod
    def in_call_order(calls: list[ToolCallPart], parts: list[ModelRequestPart]) -> list[ModelRequestPart]:
        """`parts` in the order of the calls they answer (parts answering no call last, in their order)."""
        order = {c.tool_call_id: i for i, c in enumerate(calls)}
        return sorted(parts, key=lambda p: order.get(getattr(p, "tool_call_id", ""), len(order)))

    @staticmethod
    def is_run_code(call: ToolCallPart) -> bool:
        """Whether `call` is a `run_code` snippet (else a direct call of a function tool)."""
        return call.tool_name == RUN_CODE_TOOL
