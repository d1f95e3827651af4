"""The data that crosses the workflow boundary: the run's input, the recorded spec, what continue-as-new carries.

All are plain dataclasses serialized by Temporal's pydantic payload converter. The run's records are in `_records`,
its activities' inputs and results in `_activity_io`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import Any

from pydantic_ai.messages import ModelMessage
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
from ._records import TurnRecord
from ._run_events import EventStreamSettings

__all__ = [
    "BEHAVIOR_VERSION",
    "COMPUTE_IS_NO_WAIT",
    "CONVERSATION_SENT_ONCE",
    "MAX_DEPS_BYTES",
    "OLDEST_BEHAVIOR_VERSION",
    "RECORDED_RULE_VERDICTS",
    "RELEASES_BY_BEHAVIOR_VERSION",
    "AgentSpec",
    "CatalogEntry",
    "Continuation",
    "DynamicPrompt",
    "OutputSpec",
    "RunInput",
    "ToolCatalog",
    "ToolSpec",
    "behavior_version_refusal",
]


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


BEHAVIOR_VERSION = 4
"""How the runs this release starts behave where releases differ; recorded by each (`AgentSpec.behavior_version`).

Raise it when a change would make a recorded run replay differently (another command, another order, another
recorded value), and keep the old behaviour behind `spec.behavior_version` for as long as the old version is
supported; drop a version by raising `OLDEST_BEHAVIOR_VERSION` and naming its last release below.

- 1: the execution model of 0.2.0 (`tests/histories/behavior_version_1.json`).
- 2: as 1, but an approval rule's verdict is recorded when the call is made (`approval_verdict_marker`) and
  replays read it (version 1 asks the rule again on every replay, so its replay needs the rule as it was); and the
  run's code writes how it ended the run (`completed`, `failed`, `cancelled`) into its status
  (the `CodemodeStatus` search attribute, or the `status` memo) in the workflow task that ends it: one more
  command there (`tests/histories/behavior_version_2.json`).
- 3: as 2, but a stretch of compute that goes on in the compute activity is no wait of the program: its clock
  does not move over it and its count of host calls without a wait goes on (version 2 moved the clock to the
  activity's end and started the count again, so a busy-wait on the clock ended, and a loop retrying a refused
  call was never stopped, only where a loaded machine sent its compute to the activity;
  `tests/histories/compute_escalations_v2.json`, `behavior_version_3.json`).
- 4: as 3, but each message of the conversation enters the history once: an activity that takes the conversation
  (model request, output check, `after_run`, `on_run_error`) gets the messages new since the run's previous one and
  a reference to those before (`shared._conversation`); version 3 sent the whole conversation each time, so its
  history grew with the square of its turns (`behavior_version_4.json`)."""

OLDEST_BEHAVIOR_VERSION = 1
"""The oldest behaviour version this release replays; older runs are refused by name (`workflow._run`)."""

RELEASES_BY_BEHAVIOR_VERSION = {0: "durable-codemode 0.1.0"}
"""The last release that replays each behaviour version this one does not."""

RECORDED_RULE_VERDICTS = 2
"""The behaviour version from which a run records its approval rules' verdicts instead of asking them on replay."""

RECORDED_END_STATUS = 2
"""The behaviour version from which the run's code writes how it ended the run into its status."""

CONVERSATION_SENT_ONCE = 4
"""The behaviour version from which an activity input carries only the messages new since the run's previous
one, and refers to the rest (`workflow._conversation`, `worker._conversations`)."""

COMPUTE_IS_NO_WAIT = 3
"""The behaviour version from which compute in the compute activity neither moves a program's clock nor starts its
count of host calls without a wait again (`workflow._snippet_driver`): a program answers the same wherever its
compute ran, so on a quiet machine and a loaded one alike."""


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


MAX_DEPS_BYTES = 64 * 1024
"""The most a run's deps may be, as JSON: they travel in the run's input and with every model request and tool
call (each an activity whose input is recorded), so they are ids and settings, not data."""
