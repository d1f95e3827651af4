"""The data that crosses the workflow boundary: run input and result, activity inputs, the recorded spec.

All are plain dataclasses serialized by Temporal's pydantic payload converter. Keep activity inputs small: a
nested call's input is the tool name, its arguments and its id, never the run's context or schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import SerializationInfo, SerializerFunctionWrapHandler, model_serializer, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.native_tools import AbstractNativeTool
from pydantic_ai.output import OutputObjectDefinition
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RunUsage, UsageLimits
from temporalio.common import RetryPolicy
from temporalio.contrib.workflow_streams import WorkflowStreamState

from ._approvals import ApprovalRecord, RecordedApproverPolicy
from ._carry import CarriedRepl
from ._config import SnippetLimits
from ._errors import UnsupportedBehaviorVersionError
from ._files import CarriedFiles, FilesSpec
from ._run_events import EventStreamSettings

__all__ = [
    "BEHAVIOR_VERSION",
    "FILE_LISTING_LIMIT",
    "MAX_DEPS_BYTES",
    "NAMED_RECORDS",
    "OLDEST_BEHAVIOR_VERSION",
    "RECORDED_RULE_VERDICTS",
    "RELEASES_BY_BEHAVIOR_VERSION",
    "AfterRunInput",
    "AgentSpec",
    "BatchInput",
    "BatchOutcome",
    "BatchResult",
    "BatchedCall",
    "CallRecord",
    "CatalogEntry",
    "ChildDeps",
    "ChildDepsInput",
    "ComputeRequest",
    "ComputeResult",
    "Continuation",
    "DynamicPrompt",
    "ModelRequestInput",
    "ModelStep",
    "ModelStreamTarget",
    "OutputInput",
    "OutputSpec",
    "OutputVerdict",
    "RunErrorInput",
    "RunInput",
    "RunRecovery",
    "RunResult",
    "SnippetRecord",
    "ToolCallInput",
    "ToolCatalog",
    "ToolSpec",
    "TurnRecord",
    "behavior_version_refusal",
    "bound_turns",
]

TURNS_BUDGET_BYTES = 512 * 1024
"""Roughly how much of a run's result (and of each continue-as-new input) its turn records may take: a record is
~300 B, and Temporal refuses payloads over 2 MiB, which 25 snippets of 500 calls would pass."""


@dataclass(kw_only=True)
class RunInput:
    """The input of one agent run (one workflow, possibly a chain of continue-as-new runs)."""

    agent: str
    """The agent's name, as registered with the worker."""

    prompt: str | None = None
    """The user's prompt; `None` only when `message_history` already ends with a request to answer."""

    message_history: list[ModelMessage] = field(default_factory=list)
    """Earlier conversation, e.g. a previous run's messages, in pydantic-ai's message format."""

    model: str | None = None
    """A pydantic-ai model string (`openai:gpt-5`, ...) overriding the agent's model for this run."""

    deps: Any = None
    """This run's `deps` (what tools, instructions and `prepare` functions see as `ctx.deps`), as the data
    converter wrote it; `None`: the `CodeModeAgent(deps=...)` default. Carried across continue-as-new."""

    deps_type: str | None = None
    """The qualified name of `deps`'s class when it is not plain JSON, checked against the agent's `deps_type`."""

    model_settings: dict[str, Any] | None = None
    """pydantic-ai `ModelSettings` for this run's model requests, over the agent's own (as in `Agent.run`)."""

    usage_limits: UsageLimits | None = None
    """pydantic-ai `UsageLimits` for this run, checked in workflow code before each model request and tool call
    and after each response, over the whole chain; past one, the run fails with `UsageLimitExceeded`."""

    usage: RunUsage | None = None
    """The usage the run starts counting from (`start_run(usage=...)`, as `Agent.run(usage=...)`): a conversation's
    earlier runs, so its `UsageLimits` count them too. `None`: from zero, as every run recorded before the field."""

    instructions: str | None = None
    """This run's own instructions, added to the agent's (as `Agent.run(instructions=...)`); recorded in the spec
    when the run starts, so every model request of the chain carries them."""

    started_by: str | None = None
    """Who started the run (`start_run(started_by=...)`, `codemode run`: `$USER`), for approver policies that keep a
    run's starter from approving its own calls. As the client says: Temporal does not authenticate it."""

    continuation: Continuation | None = None
    """Set by the runtime when a run continues as new; never set it yourself."""

    stream: bool | None = None
    """Whether the run streams its events (`start_run(stream=...)`): `True` with the agent's `EventStreamSettings`
    (or the defaults), `False` not even if the agent does, `None` as the agent says (`CodeModeAgent(stream=...)`)."""

    stream_state: WorkflowStreamState | None = None
    """The event stream a continue-as-new carries into the next run (set by the runtime; never set it yourself)."""


@dataclass(kw_only=True)
class ToolSpec:
    """How one tool is called, as recorded when the run started."""

    name: str
    activity_type: str
    in_sandbox: bool
    timeout: timedelta
    retry_policy: RetryPolicy
    local: bool
    requires_approval: bool = False
    approval_rule: bool = False
    """The tool has an `approval_rule`: its verdict on each call is decided when the call is made, by the rule as
    the worker serving the run has it, and recorded (behaviour version 2 on; runs of version 1 ask the rule again
    on every replay)."""
    rule_fingerprint: str | None = None
    """What the `approval_rule` was when the run started (`worker/_rules.rule_fingerprint`), for `codemode
    check-deploy` to tell a changed rule; `None`: no rule, or a run recorded before the field."""
    approval_timeout: timedelta | None = None
    heartbeat_timeout: timedelta | None = None
    """Recorded `ToolOptions.heartbeat_timeout`; runs recorded before it read `None` (no heartbeats)."""
    approvers: RecordedApproverPolicy | None = None
    """Who may decide the tool's calls (`ToolOptions.approvers`, groups resolved when the run started)."""
    max_retries: int | None = None
    """pydantic-ai's retry budget of the tool (its own `max_retries`, else the agent's tool retries): how many times
    in a row the model may be asked to retry a direct call of it; `None` (runs recorded before it): no bound."""
    schema_digest: str | None = None
    """An MCP tool's argument and result schemas as the run recorded them (a short digest): each call sends it, and
    the worker refuses the call when the server now describes the tool differently. `None` for other tools (their
    schemas change only with a deploy) and in runs recorded before the field."""
    batch: bool = False
    """`ToolOptions.batch`: a program's calls to it in flight at once run as one batch activity (`BatchInput`).
    Recorded, so a run's batching never follows the worker's current config: runs recorded before the field read
    `False` and replay with one activity per call, as they ran."""
    child_run: str | None = None
    """The agent a call of this tool runs as a child run (`child_run_tool`): a workflow of its own, started by the
    run, whose output is the call's result and whose usage counts in the run's. `None`: an activity, as every tool
    of runs recorded before the field."""
    child_deps: bool = False
    """A `child_run_tool(deps=...)`: each call first derives the child's deps from the run's context, in an activity
    (`CHILD_DEPS_ACTIVITY`), and the child records them. `False`: the child gets none (every run recorded before)."""


@dataclass(kw_only=True)
class OutputSpec:
    """The agent's `output_type` as a run records it: what the model is asked for, and what ends the run.

    Recorded (not re-read from the worker) so a deploy that changes an agent's output type never changes how an
    old run replays; the values are pydantic-ai's own (`OutputSchema`), sent back in every model request.
    """

    mode: str
    """pydantic-ai's output mode (`tool`, `native`, `prompted`, `text`, `auto`, ...)."""
    tools: list[ToolDefinition] = field(default_factory=list)
    """The output tools (`final_result`, ...): a call to one is a candidate final answer."""
    object_def: OutputObjectDefinition | None = None
    prompted_template: str | None = None
    allows_text: bool = True
    allows_image: bool = False
    structured_text: bool = False
    """The output is JSON in the text (`NativeOutput` / `PromptedOutput`): under `end_strategy='early'` such text
    ends the run even beside tool calls, as in pydantic-ai."""
    end_strategy: str = "graceful"
    """pydantic-ai's `end_strategy`: `early` tries an output before running the response's other calls; `graceful`
    and `exhaustive` run them first."""

    @property
    def tool_names(self) -> frozenset[str]:
        """The output tools' names."""
        return frozenset(t.name for t in self.tools)


@dataclass(kw_only=True)
class DynamicPrompt:
    """One `dynamic=True` system prompt of a run, as pydantic-ai's `SystemPromptPart` refers to it."""

    index: int
    """Its place in `AgentSpec.system_prompts`, which holds its value when the run started."""
    ref: str
    """The function's `__qualname__` (`SystemPromptPart.dynamic_ref`)."""
    context_id: str | None = None
    """Set for `on_change='append'`: a changed value is a new statement, not a rewrite of the old ones."""


@dataclass(kw_only=True)
class CatalogEntry:
    """One sandbox tool of a large catalog, as the run records it (`ToolCatalog`)."""

    name: str
    summary: str
    """The first line of its docstring: its line in the `run_code` description, and what `search_tools` gives."""
    function: str
    """Its `async def` with the docstring, as in the stubs."""
    types: list[int] = field(default_factory=list)
    """The type definitions its stub uses, in order, as indexes into `ToolCatalog.types`."""


@dataclass(kw_only=True)
class ToolCatalog:
    """The sandbox tools of a run whose `run_code` description carries an index instead of every stub.

    Recorded with the run (`AgentSpec.catalog`): the sandbox's `search_tools` and `describe_tool` are answered
    from it in workflow code. Each type definition is kept once (a domain's record type is shared by its tools),
    which keeps a 300-tool spec well under Temporal's 512 KiB payload warning.
    """

    entries: list[CatalogEntry]
    types: list[str] = field(default_factory=list)
    """Every type definition some entry uses, once each."""

    def stub(self, entry: CatalogEntry) -> str:
        """The full stub of `entry`: the type definitions it uses, then its `async def`."""
        return "\n\n".join([*(self.types[i] for i in entry.types), entry.function]) + "\n"


BEHAVIOR_VERSION = 2
"""How the runs this release starts behave where releases differ; recorded by each (`AgentSpec.behavior_version`).

Raise it when a change would make a recorded run replay differently (another command, another order, another
recorded value), and keep the old behaviour behind `spec.behavior_version` for as long as the old version is
supported; drop a version by raising `OLDEST_BEHAVIOR_VERSION` and naming its last release below.

- 1: the execution model of 0.2.0 (`tests/histories/behavior_version_1.json`).
- 2: as 1, but an approval rule's verdict is recorded when the call is made (`approval_verdict_marker`) and
  replays read it (version 1 asks the rule again on every replay, so its replay needs the rule as it was); and the
  run's code writes how it ended the run (`completed`, `failed`, `cancelled`) into its status
  (the `CodemodeStatus` search attribute, or the `status` memo) in the workflow task that ends it: one more
  command there (`tests/histories/behavior_version_2.json`)."""

OLDEST_BEHAVIOR_VERSION = 1
"""The oldest behaviour version this release replays; older runs are refused by name (`workflow._run`)."""

RELEASES_BY_BEHAVIOR_VERSION = {0: "durable-codemode 0.1.0"}
"""The last release that replays each behaviour version this one does not."""

RECORDED_RULE_VERDICTS = 2
"""The behaviour version from which a run records its approval rules' verdicts instead of asking them on replay."""

RECORDED_END_STATUS = 2
"""The behaviour version from which the run's code writes how it ended the run into its status."""


@dataclass(kw_only=True)
class AgentSpec:
    """Everything a run needs to know about its agent, recorded once at the start by an activity.

    Replays (and every continue-as-new run of the chain) read this record instead of the worker's current
    configuration: a deploy that changes an agent's limits or stubs never changes how an old run replays.
    """

    agent: str
    model_name: str
    instructions: str | None
    code_mode: bool
    model_tools: list[ToolDefinition]
    """The tool definitions the model sees: `run_code` (in code mode) and the native tools."""
    tools: list[ToolSpec]
    stubs: str
    """The Python stubs of the sandbox tools, used to type-check snippets."""
    limits: SnippetLimits
    env: dict[str, str]
    """Environment variables the sandbox may read: the agent's allow-list, valued when the run started."""
    system_prompts: list[str] = field(default_factory=list)
    """The agent's system prompts (`system_prompt=` and `@agent.system_prompt` functions, given the run's deps),
    put at the start of a new conversation as pydantic-ai does; runs recorded before the field read none."""
    dynamic_prompts: list[DynamicPrompt] = field(default_factory=list)
    """Which of `system_prompts` come from `@agent.system_prompt(dynamic=True)` functions, valued when the run
    started: their parts carry the function's ref, and a run given a message history re-values the parts there
    that carry one (`workflow._system_prompts`). Runs recorded before the field read none and run as they ran."""
    payload_store: bool = False
    """Whether the worker that started the run offloads large payloads to a payload store, so a compute activity
    may carry a program's dump over Temporal's 2 MiB payload limit."""
    signed_approvals: bool = False
    """Whether decisions must be signed by one of the workers' approver keys (`create_worker(approver_keys=...)`);
    `False`: the worker that started the run allowed unsigned ones (`unsigned_approvals=True`), or the run was
    recorded before signing existed. Each decision's record says whether it was signed."""
    output: OutputSpec | None = None
    """The agent's structured output, or output validators (checked by the output activity); `None`: `str` output
    with no validators, where the model's text is the answer (every run recorded before the field)."""
    native_tools: list[AbstractNativeTool] = field(default_factory=list)
    """The provider's own tools the model is offered (web search, code execution, ...: a capability's
    `get_native_tools`, resolved with the run's deps at its start). The provider runs them within the model
    request, so what they did is in the recorded response."""
    files: FilesSpec | None = None
    """The run's filesystem (`CodeModeAgent(files=RunFiles(...))`), with its seeded files; `None`: programs have
    no files (file calls raise `PermissionError`), as in every run recorded before the field."""
    catalog: ToolCatalog | None = None
    """The sandbox tools of a large catalog (past the agent's `CatalogSettings`): the `run_code` description lists
    one line per tool and programs may call `search_tools` / `describe_tool`, answered from these entries.
    `None`: the description carries every stub and programs have no catalog functions (every small agent, and
    every run recorded before the field)."""
    model_request_hooks: bool = False
    """Whether the agent's capabilities have model-request hooks (`before_model_request`, `ProcessHistory`, ...):
    the model activity then runs them around the model call and answers a `ModelStep` (the response, and the
    history when a hook rewrote it), which the run adopts. `False`: no such hooks, or a run recorded before they
    were applied: the activity answers a bare `ModelResponse`, as every such run recorded."""
    after_run_hooks: bool = False
    """Whether the agent's capabilities have `after_run` hooks: the run's output, once decided, goes through them
    in the after-run activity, and the output they return is the run's. `False`: no such hooks, or a run recorded
    before they were applied (it ends with its output as it ran)."""
    run_error_hooks: bool = False
    """Whether the agent's capabilities have `on_run_error` hooks: a failure of the run's body goes through them in
    the run-error activity, and a result they return recovers the run. `False`: no such hooks, or a run recorded
    before they were applied (it fails as it ran)."""
    stream: EventStreamSettings | None = None
    """How the agent's runs stream their events (`CodeModeAgent(stream=...)`); `None`: they do not, unless a run
    asks (`RunInput.stream`). Recorded, so a deploy never changes what an open run's stream keeps."""
    behavior_version: int = 0
    """How this run behaves where releases of durable-codemode differ (`BEHAVIOR_VERSION`): recorded when the run
    starts, so a replay takes the same decisions. `0`: recorded before the field, by a release this one does not
    replay (`RELEASES_BY_BEHAVIOR_VERSION` names the one that does); the run workflow refuses such a run by name
    (`UnsupportedBehaviorVersionError`) with a workflow-task failure, so the run itself is never failed."""

    def tool(self, name: str) -> ToolSpec | None:
        """The spec of the tool called `name`, or `None`."""
        return self._tools_by_name.get(name)

    @cached_property
    def _tools_by_name(self) -> dict[str, ToolSpec]:
        # Looked up on every tool call, and a large catalog has thousands of tools. Not a field: never serialized,
        # and a recorded spec is never changed in place (a changed one is a new `AgentSpec`).
        return {t.name: t for t in self.tools}


def behavior_version_refusal(spec: AgentSpec, workflow_id: str) -> UnsupportedBehaviorVersionError | None:
    """Why this release does not replay run `workflow_id` of `spec` (the error a replay raises); `None` if it does.

    The one check of `AgentSpec.behavior_version`: the run workflow raises the error, the replay report explains it.
    """
    version = spec.behavior_version
    if OLDEST_BEHAVIOR_VERSION <= version <= BEHAVIOR_VERSION:
        return None
    return UnsupportedBehaviorVersionError(workflow_id, version, RELEASES_BY_BEHAVIOR_VERSION.get(version),
                                           OLDEST_BEHAVIOR_VERSION, BEHAVIOR_VERSION)


@pydantic_dataclass(kw_only=True)
class CallRecord:
    """One tool call, nested in a snippet or made directly by the model.

    Every call of a run has one in the run's result (and in each continue-as-new input), so its JSON is compact: a
    list `[call_id, tool, args, status, result, started_at, microseconds to finished_at]`, about 100 bytes fewer
    per call than an object with these keys. Objects with the keys (records written before, or by hand) are read
    too. `codemode run --json` prints objects (`NAMED_RECORDS`), as `dataclasses.asdict(record)` gives them. A
    pydantic dataclass so that its serializer applies wherever a record is nested (Temporal's converter writes
    payloads without a type).
    """

    call_id: str
    tool: str
    args: str
    """A preview of the arguments (at most ~200 characters)."""
    status: Literal["ok", "error", "cancelled", "denied"]
    result: str
    """A preview of the result or the error."""
    started_at: datetime
    finished_at: datetime

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            return value  # an object with the field names, or keyword arguments: validated as they are
        if len(value) != 7 or not isinstance(value[6], int):
            raise ValueError("a compact CallRecord is [call_id, tool, args, status, result, started_at, "
                             "microseconds to finished_at]")
        call_id, tool, args, status, result, started, micros = value
        started_at = started if isinstance(started, datetime) else datetime.fromisoformat(started)
        return {"call_id": call_id, "tool": tool, "args": args, "status": status, "result": result,
                "started_at": started_at, "finished_at": started_at + timedelta(microseconds=micros)}

    @classmethod
    def made(cls, *, call_id: str, tool: str, args: str, status: Literal["ok", "error", "cancelled", "denied"],
             result: str, started_at: datetime, finished_at: datetime) -> CallRecord:
        """A record of fields workflow code made itself, so of the right types: built without validation.

        Every nested call builds one in workflow code; validating what is right by construction was most of its
        cost there (`_record`, timed in a replay of sequential-200: ~23 -> ~12 µs of CPU a call). Records read
        from payloads are validated as ever.
        """
        record = object.__new__(cls)
        record.__dict__.update(call_id=call_id, tool=tool, args=args, status=status, result=result,
                               started_at=started_at, finished_at=finished_at)
        return record

    @model_serializer(mode="wrap")
    def _to_list(self, named: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        if isinstance(info.context, dict) and info.context.get("records") == NAMED_RECORDS["records"]:
            return named(self)
        micros = (self.finished_at - self.started_at) // timedelta(microseconds=1)
        return [self.call_id, self.tool, self.args, self.status, self.result, self.started_at, micros]


NAMED_RECORDS = {"records": "named"}
"""The serialization context that writes `CallRecord`s as objects with their field names (for people and scripts
that read the JSON), e.g. `TypeAdapter(RunResult[Any]).dump_json(result, context=NAMED_RECORDS)`."""


@dataclass(kw_only=True)
class SnippetRecord:
    """One `run_code` call."""

    call_id: str
    code: str
    outcome: Literal["ok", "error", "rejected", "compute_limit", "sandbox_crashed"]
    """`ok`: completed; `error`: raised inside the sandbox; `rejected`: syntax/type error, the model was asked
    to retry; `compute_limit` / `sandbox_crashed`: the run continued as new."""
    result: str
    """A preview of what the model got back."""
    calls: list[CallRecord] = field(default_factory=list)
    omitted_calls: int = 0
    """Call records dropped from `calls` to keep a long run's summary under Temporal's payload limit (oldest
    snippets first, see `bound_turns`); the calls themselves are in the history (`codemode trace`)."""
    computed_seconds: float | None = None
    """Compute the program did in compute activities (past its in-workflow budget); `None`: it needed none."""
    files: dict[str, int] | None = None
    """The run's files after the snippet (path under `/files` -> bytes), when it changed them; `None`: unchanged
    (or the run has no files). At most `FILE_LISTING_LIMIT` entries; `files_omitted` counts the rest."""
    files_omitted: int = 0


FILE_LISTING_LIMIT = 50
"""Files a snippet record lists at most (`SnippetRecord.files`), so a run with thousands stays small."""


@dataclass(kw_only=True)
class TurnRecord:
    """One model request and what the run did with its response."""

    index: int
    text: str
    """The text parts of the response (the final answer, on the last turn)."""
    snippets: list[SnippetRecord] = field(default_factory=list)
    direct_calls: list[CallRecord] = field(default_factory=list)
    omitted_direct_calls: int = 0
    """Like `SnippetRecord.omitted_calls`, for `direct_calls`."""


@dataclass(kw_only=True)
class Continuation:
    """What a run carries into the next run of its continue-as-new chain."""

    spec: AgentSpec
    usage: RunUsage
    turns: list[TurnRecord]
    runs: int
    """How many runs of this chain ended by continue-as-new before this one."""
    note: str | None = None
    """Why the last run continued as new, when the model must be told (e.g. the REPL was restarted)."""
    approvals: list[ApprovalRecord] = field(default_factory=list)
    repl: CarriedRepl | None = None
    """The REPL's variables, sealed by the worker (see `_carry`); `None`: the next run starts a fresh REPL."""
    output_retries: int = 0
    """Output retries the chain has used (rejected answers), counted against the agent's output retry budget."""
    tool_retries: dict[str, int] = field(default_factory=dict)
    """Retries in a row of each native tool the model called directly, counted against its `max_retries`."""
    files: CarriedFiles | None = None
    """The files the run's programs wrote (`RunFiles`); `None`: none, or the run has no files."""
    new_message_index: int = 0
    """Where the chain's own messages start in its conversation: the length of the history its first run was
    given (`RunResult.new_messages`). Continuations recorded before the field read 0."""


OutputT = TypeVar("OutputT")


@dataclass(kw_only=True)
class RunResult(Generic[OutputT]):
    """What an agent run returns; `RunResult[Answer]` when the client asked for the output as its type.

    From the workflow the output is the answer as JSON (a `BaseModel` as its dict); `run_agent(output_type=...)`
    and `run_result(handle, output_type=...)` validate it back into the agent's output type.
    """

    output: OutputT
    usage: RunUsage
    turns: list[TurnRecord]
    continued_as_new: int
    """Runs of this chain that ended by continue-as-new."""
    approvals: list[ApprovalRecord] = field(default_factory=list)
    """The audit trail: every approval decision of the run (who, when, note, call, arguments)."""
    messages: list[ModelMessage] = field(default_factory=list)
    """The conversation at the run's end, as `AgentRunResult.all_messages()` gives it: the history the run was given,
    then its own requests and responses (ending, for an output tool's answer, with that tool's return). Empty in
    results of runs that ended before the field existed."""
    new_message_index: int = 0
    """Where this run's own messages start in `messages` (`new_messages()`)."""
    output_tool_name: str | None = None
    """The output tool whose call gave the output, when one did (`all_messages(output_tool_return_content=...)`)."""
    run_id: str | None = None
    """The run's workflow id (`AgentRunResult.run_id`): `client.get_workflow_handle(run_id)` finds its history, and
    `codemode trace RUN_ID` draws it. `None` in results of runs that ended before the field existed."""

    def all_messages(self, *, output_tool_return_content: str | None = None) -> list[ModelMessage]:
        """The run's whole conversation, to continue it in the next run (`start_run(message_history=...)`).

        As pydantic-ai's `AgentRunResult.all_messages`: `output_tool_return_content` replaces what the output tool's
        call returned in the last message (`'Final result processed.'`), e.g. 'Please suggest another flight'.

        Raises:
            ValueError: `output_tool_return_content` for a run whose output was not given by an output tool.
            LookupError: the last message has no return of the output tool.

        """
        if output_tool_return_content is None:
            return list(self.messages)
        if self.output_tool_name is None:
            raise ValueError("Cannot set output tool return content when the output was not given by an output tool "
                             "(a text answer, or a run that ended before RunResult recorded its output tool).")
        last = self.messages[-1] if self.messages else None
        if isinstance(last, ModelRequest):
            for i, part in enumerate(last.parts):
                if isinstance(part, ToolReturnPart) and part.tool_name == self.output_tool_name:
                    answered = replace(cast(Any, part), content=output_tool_return_content)  # (subclasses narrow it)
                    parts = [*last.parts[:i], answered, *last.parts[i + 1:]]
                    return [*self.messages[:-1], replace(last, parts=parts)]
        raise LookupError(f"No tool call found with tool name {self.output_tool_name!r}.")

    def new_messages(self, *, output_tool_return_content: str | None = None) -> list[ModelMessage]:
        """The messages this run added: `all_messages()` without the history it was given."""
        return self.all_messages(output_tool_return_content=output_tool_return_content)[self.new_message_index:]

    def all_messages_json(self, *, output_tool_return_content: str | None = None) -> bytes:
        """`all_messages()` as JSON (`ModelMessagesTypeAdapter`), e.g. to store a conversation."""
        return ModelMessagesTypeAdapter.dump_json(
            self.all_messages(output_tool_return_content=output_tool_return_content))

    def new_messages_json(self, *, output_tool_return_content: str | None = None) -> bytes:
        """`new_messages()` as JSON (`ModelMessagesTypeAdapter`)."""
        return ModelMessagesTypeAdapter.dump_json(
            self.new_messages(output_tool_return_content=output_tool_return_content))

    @property
    def nested_calls(self) -> list[CallRecord]:
        """Every tool call made from a snippet, in order.

        A very long run's oldest call records may be omitted to bound the result (`SnippetRecord.omitted_calls`).
        """
        return [c for t in self.turns for s in t.snippets for c in s.calls]

    @property
    def direct_calls(self) -> list[CallRecord]:
        """Every tool call the model made directly (tools outside the sandbox, or code mode off)."""
        return [c for t in self.turns for c in t.direct_calls]


@dataclass(kw_only=True)
class ModelRequestInput:
    """The input of the model-request activity."""

    agent: str
    model: str | None
    messages: list[ModelMessage]
    tools: list[ToolDefinition]
    deps: Any = None
    """The run's deps (`RunInput.deps`), for model settings that are a function of the run context."""
    model_settings: dict[str, Any] | None = None
    """The run's own model settings (`RunInput.model_settings`), merged over the agent's."""
    output: OutputSpec | None = None
    """The recorded output spec (`AgentSpec.output`): what output the model is asked for."""
    hooks: bool = False
    """Run the capabilities' model-request hooks around the call and answer a `ModelStep`
    (`AgentSpec.model_request_hooks`); `False`: call the model alone and answer its `ModelResponse`."""
    usage: RunUsage | None = None
    """The run's usage before this request (`ctx.usage` of the hooks); sent only with `hooks`."""
    run_step: int = 0
    """The request's step in the run, from 1 (`ctx.run_step` of the hooks, as pydantic-ai counts requests)."""
    output_retries: int = 0
    """Output retries the run has used (`hooks` only): a hook's `ModelRetry` past the agent's budget fails the run."""
    native_tools: list[AbstractNativeTool] = field(default_factory=list)
    """The provider tools the request offers (`AgentSpec.native_tools`)."""
    stream: ModelStreamTarget | None = None
    """Publish the model's stream to the run's event stream (`worker/_model_stream`); `None`: the run does not
    stream, and the request is made as before."""


@dataclass(kw_only=True)
class ModelStreamTarget:
    """Where and how a model activity publishes what its model streams: the run's stream, as model turn `turn`."""

    turn: int
    batch_interval: timedelta


@dataclass(kw_only=True)
class ModelStep:
    """What the model activity answers when it runs model-request hooks (`ModelRequestInput.hooks`)."""

    response: ModelResponse | None
    """The response the run goes on with (the model's, or one a hook gave: `SkipModelRequest`,
    `on_model_request_error`); `None` when a hook raised `ModelRetry`: then `retry` is the next request."""
    messages: list[ModelMessage] | None = None
    """The run's history as the hooks left it (`ProcessHistory` writes the processed history back, as in
    `agent.run()`), ending with the request; `None`: the hooks left it alone (the usual case: nothing recorded)."""
    retry: ModelRequest | None = None
    """The retry request a hook's `ModelRetry` asks for (pydantic-ai's `RetryFeedbackPart`)."""


@dataclass(kw_only=True)
class OutputInput:
    """The input of the output activity: a response that may end the run, and the conversation before it."""

    agent: str
    model: str | None
    messages: list[ModelMessage]
    """The conversation up to the request the response answers (what output validators see as `ctx.messages`)."""
    response: ModelResponse
    """The candidate: the response's output tool calls, or its text (and files) when it called no tool."""
    retries: int
    """Output retries used so far (`ctx.retry` of output validators; past the budget the run fails)."""
    deps: Any = None
    model_settings: dict[str, Any] | None = None
    output_fingerprint: str | None = None
    """The run's recorded output (`AgentSpec.output`) as `_fingerprints.OutputShape.fingerprint`: a worker whose
    agent's output differs refuses, by name, an answer its output rejects (the model was offered the recorded one,
    so asking it again cannot help). `None` in inputs recorded before the field: checked as they were."""
    output_summary: str | None = None
    """The recorded output in words (`OutputShape.summary`), for that refusal."""


@dataclass
class AfterRunInput:
    """The input of the after-run activity: a run's decided output (as JSON) and what its `AgentRunResult` holds."""

    agent: str
    model: str | None
    messages: list[ModelMessage]
    output: Any
    usage: RunUsage
    deps: Any = None


@dataclass(kw_only=True)
class RunErrorInput:
    """The input of the run-error activity: how a run's body failed, and what its `RunContext` holds then."""

    agent: str
    model: str | None
    messages: list[ModelMessage]
    usage: RunUsage
    error_type: str
    """The failure's type, as the run would fail with it (`UsageLimitExceeded`, `UnexpectedModelBehavior`, ...)."""
    error_message: str
    deps: Any = None


@dataclass(kw_only=True)
class RunRecovery:
    """What the run-error activity found: whether the `on_run_error` hooks recovered the run, and its output."""

    recovered: bool
    output: Any = None
    """The output (JSON) of the result the hooks returned, when `recovered`."""


@dataclass(kw_only=True)
class OutputVerdict:
    """What the output activity found: the final output, or the request asking the model to try again."""

    output: Any = None
    """The validated output as JSON (`retry is None`)."""
    retry: ModelRequest | None = None
    """pydantic-ai's retry request (the validation errors, or an output validator's `ModelRetry` message)."""
    closing: ModelRequest | None = None
    """With `output`: the request pydantic-ai ends such a run's messages with, answering its output tool calls
    (`'Final result processed.'`); `None` for a text answer, and in verdicts recorded before the field."""
    output_tool: str | None = None
    """With `output`: the output tool whose call gave it (`RunResult.output_tool_name`)."""


@dataclass(kw_only=True)
class ChildDepsInput:
    """The input of the child-deps activity: the parent's call and deps, from which its child's deps are derived."""

    agent: str
    """The parent's agent, whose tool `tool` derives the deps."""
    tool: str
    call_id: str
    deps: Any = None
    """The parent run's deps (`RunInput.deps`), built as its agent's `deps_type` for the `RunContext`."""


@dataclass(kw_only=True)
class ChildDeps:
    """A child run's deps as it records them (`RunInput.deps`, `deps_type`), derived from its parent's context."""

    deps: Any = None
    deps_type: str | None = None
    """`module.QualName` of the value's class when it is not plain JSON (as `start_run` records deps)."""


@pydantic_dataclass(kw_only=True)
class ToolCallInput:
    """The input of a tool activity: only what the call needs, to keep histories small.

    The tool is in the activity type (`<agent>.<tool>`) and the call id in the activity id (`<call id>-<digest>`), and
    the activity reads them from there; the input holds the arguments. (Inputs recorded by 0.1.0 carried `tool` and
    `call_id` too: those keys are ignored.)

    A pydantic dataclass only so that its optional fields are left out of the payload while unset (`_unset_left_out`):
    every call of a run without deps would otherwise record `"deps":null`, and every non-MCP call
    `"schema_digest":null`, in the history.
    """

    args: dict[str, Any]
    deps: Any = None
    """The run's deps (`RunInput.deps`), rebuilt as the agent's `deps_type` for the tool's `RunContext`."""
    schema_digest: str | None = None
    """`ToolSpec.schema_digest`: the MCP tool's schemas as the run recorded them, checked against the server's."""

    @model_serializer(mode="wrap")
    def _unset_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value is not None or key == "args"}


@dataclass(kw_only=True)
class BatchedCall:
    """One call of a batch: its own id (the idempotency key the tool sees) and arguments."""

    call_id: str
    args: dict[str, Any]


@dataclass(kw_only=True)
class BatchInput:
    """The input of a batch activity: calls of one batched tool a program had in flight at once.

    Each call keeps what a `ToolCallInput` would give it (its id, arguments, the run's deps, shared once), and the
    tool's per-call options ride along, so the worker runs each call as the tool's own activity would: `timeout`
    per try, transient failures retried by `retry_policy` inside the batch.
    """

    agent: str
    tool: str
    calls: list[BatchedCall]
    deps: Any = None
    timeout: timedelta
    """`ToolOptions.timeout`: one try of one call."""
    retry_policy: RetryPolicy
    """`ToolOptions.retry_policy`: the tries each call gets for transient failures (and the backoff between them)."""
    schema_digest: str | None = None
    """`ToolSpec.schema_digest` of an MCP tool: each call is refused when the server now describes it differently."""


@dataclass(kw_only=True)
class BatchOutcome:
    """What one call of a batch came to (in `BatchResult`, and in the batch's heartbeat details)."""

    call_id: str
    kind: Literal["ok", "error", "deferred"]
    """`ok`: `value` is the result; `error`: the call failed for good, `error_type` / `message` say how (as the
    tool's own activity would have failed); `deferred`: it ran, but its result did not fit in the batch's payload,
    so the workflow runs it again as its own activity (batched tools are read-only)."""
    value: Any = None
    error_type: str | None = None
    message: str | None = None
    usage: RunUsage | None = None
    """`ok`: what the call added to its `ctx.usage` (a sub-agent run), counted in the run's usage; `None`: nothing
    (and in outcomes recorded before the field)."""


@dataclass(kw_only=True)
class BatchResult:
    """The result of a batch activity: one outcome per call, in the order of `BatchInput.calls`."""

    outcomes: list[BatchOutcome]


def _size(call: CallRecord) -> int:
    return len(call.call_id) + len(call.tool) + len(call.args) + len(call.result) + 160  # keys, timestamps


def _files_size(snippet: SnippetRecord) -> int:
    return sum(len(path) + 12 for path in snippet.files) if snippet.files else 0


def bound_turns(turns: list[TurnRecord], budget: int = TURNS_BUDGET_BYTES) -> None:
    """Drop the call records of the oldest snippets (and direct calls) until the records fit `budget` (in place).

    Turns, snippets, their code and result previews are kept; only per-call detail goes, counted in
    `omitted_calls`, and the snippets' file listings, counted in `files_omitted`. It is deterministic, as workflow
    code must be.
    """
    total = sum(len(s.code) + len(s.result) + 120 + sum(_size(c) for c in s.calls) + _files_size(s)
                for t in turns for s in t.snippets) + sum(_size(c) for t in turns for c in t.direct_calls)
    for turn in turns:
        if total <= budget:
            return
        for snippet in turn.snippets:
            total -= sum(_size(c) for c in snippet.calls) + _files_size(snippet)
            snippet.omitted_calls += len(snippet.calls)
            snippet.calls = []
            if snippet.files:
                snippet.files_omitted += len(snippet.files)
                snippet.files = {}
        total -= sum(_size(c) for c in turn.direct_calls)
        turn.omitted_direct_calls += len(turn.direct_calls)
        turn.direct_calls = []


@dataclass(kw_only=True)
class ComputeResult:
    """Output of the compute activity: where the program got to, at its next host round trip or its end."""

    kind: Literal["suspended", "complete", "error", "runaway", "crashed", "too_large"]
    """`suspended`: at its next host round trip (a tool call, a clock read, a wait: workflow code answers it);
    `complete` / `error`: the snippet ended (a value, or an exception it did not catch); `runaway`: past
    `max_compute_seconds`; `crashed`: its sandbox process died, or it did not repeat itself; `too_large`: where
    it got to is over `ComputeRequest.max_dump_bytes` (`error` holds the size)."""
    state: str | None = None
    """`suspended`: the suspended program's dump; `complete` / `error`: the REPL after the snippet (base64)."""
    output: Any = None
    """`complete`: the program's value (`_results.jsonable`)."""
    printed: str = ""
    """What the program printed from the request's `state` on."""
    error: str | None = None
    """`error`: the exception (`Type: message`); `runaway` / `crashed`: what happened."""
    traceback: str | None = None
    seconds: float = 0.0
    """Wall time the stretch computed."""
    where: Literal["activity", "workflow"] = "activity"
    """Where it computed: in the activity, or in workflow code (past the budget, recorded by the activity)."""


@dataclass(kw_only=True)
class ComputeRequest:
    """Input of the compute activity: a stretch of a program to compute, from a dump (see `worker/_compute`)."""

    agent: str
    run_code_id: str
    start: Literal["feed", "snapshot", "computed"]
    """`feed`: start the snippet `code` in the REPL `state` (`None`: a fresh REPL); `snapshot`: load the suspended
    program `state`; then give it `answers` in order. `computed`: workflow code already computed the stretch (it
    took longer than the in-workflow budget): `state` is where it got to, and the activity records it."""
    state: str | None
    """A Monty dump, base64 (`_compute_wire.encode_dump`)."""
    code: str = ""
    answers: list[Any] = field(default_factory=list)
    """What workflow code answered the program's suspensions with since `state`, encoded by `_compute_wire`:
    the activity gives them again (the program repeats itself exactly), and the last one starts the stretch."""
    limits: SnippetLimits
    seed: int = 0
    """`feed` into a fresh REPL: the seed workflow code drew for its `random`."""
    max_dump_bytes: int | None = None
    """The largest dump the activity may return (no payload store: Temporal's 2 MiB payload limit); `None`: any."""
    computed: ComputeResult | None = None
    """`computed`: the outcome to record."""
    cwd: str | None = None
    """`feed`: the snippet's working directory (`/files` in runs with files); `None`: Monty's default."""


MAX_DEPS_BYTES = 64 * 1024
"""The most a run's deps may be, as JSON: they travel in the run's input and with every model request and tool
call (each an activity whose input is recorded), so they are ids and settings, not data."""
