"""The public API is what users import: five modules, each list pinned, every name described in docs/api.md.

What is not listed here is private and may change in any release; a name that enters or leaves the public API is a
decision, so it changes this test and docs/api.md together.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import typing
from pathlib import Path

import pytest

import durable_codemode

API_DOC = Path(__file__).parent.parent / "docs" / "api.md"

PUBLIC: dict[str, set[str]] = {
    "durable_codemode": {
        "AgentNotFoundError", "ApprovalRecord", "ApprovalSigner", "ApproverKeyring", "ApproverPolicy",
        "CallRecord", "CatalogSettings", "CodeModeAgent", "CodeModeError", "CodeModePlugin",
        "CodeModeRunWorkflow", "CodeModeUserError", "DecidedCalls", "DecisionConflictError", "DepsFactoryError",
        "EncryptionCodec", "EncryptionError", "EncryptionKeyError", "EncryptionKeys", "EventStreamSettings",
        "InvalidRunInputError", "LocalPayloadStore", "OutputChangedError", "PayloadNotFoundError",
        "PayloadStoreAccessError", "PayloadStoreError", "PendingApproval", "PoolSettings", "RejectedDecision",
        "RunClosedError", "RunFailedError", "RunFiles", "RunNotFoundError", "RunResult", "RunWorkflowFailedError",
        "S3PayloadStore", "SnippetLimits", "SnippetRecord",
        "ToolCallContext", "ToolOptions", "TransientToolError", "TurnRecord", "UnsupportedBehaviorVersionError",
        "WorkerBusyError", "WorkerUnavailableError", "add_child_run_tool", "child_run_tool", "connect",
        "create_worker", "current_call", "data_converter", "decide", "decide_all", "generate_approver_key",
        "pending_approvals", "rejected_decisions", "run_agent", "run_result", "run_script", "start_dev_server",
        "start_run", "stream_events", "typed_result", "wait_for_approvals",
    },
    "durable_codemode.testing": {
        "CallTool", "FinalOutput", "RunCode", "Step", "child_processes", "conversation_cache", "fetch_chain_histories",
        "last_result",
        "new_task_queue", "replay", "running_worker", "scripted_model", "start_dev_server", "tool_call_context",
        "user_prompt",
    },
    "durable_codemode.debugging": {
        "CallSide", "CallStatus", "Cause", "DeployCheck", "Divergence", "Finding", "ReplayCapture",
        "ReplayReport", "RunCheck", "RunReplay", "RunSummary", "RunTrace", "TraceApproval", "TraceCall",
        "TraceRun", "TraceSnippet", "TraceTurn", "check_deploy", "fetch_chain", "fetch_history",
        "histories_from_json", "histories_to_json", "import_agents", "list_runs", "load_agents", "move_run",
        "register_agents", "render_deploy_check", "render_replay", "render_trace", "replay_histories",
        "replay_history", "replay_recent", "replay_run", "trace_histories", "trace_run",
    },
    "durable_codemode.events": {
        "ApprovalDecidedEvent", "ApprovalWaitEvent", "ChildRunEndEvent", "ChildRunStartEvent", "CodeModeEvent",
        "ComputeEscalatedEvent", "EventStreamSettings", "EventsTrimmedEvent", "ModelRequestStartEvent",
        "ModelStreamResetEvent", "NestedCallEndEvent", "NestedCallStartEvent", "PrintEvent", "RunContinuedEvent",
        "RunEndEvent", "RunEndStatus", "RunEventItem", "RunStartEvent", "SnippetEndEvent", "SnippetStartEvent",
    },
    "durable_codemode.ui": {"DEFAULT_UI_PORT", "UIAccess", "chat_app", "codec_server_app", "serve_ui", "ui_app"},
}

FOLDERS = {"workflow", "shared", "worker", "client", "history", "cli", "ui", "apps"}
"""The package's folders: each holds only private modules (`cli` is the command line, `ui` the page and chat)."""


def _documented() -> dict[str, set[str]]:
    """The names docs/api.md describes, by the module heading they stand under."""
    found: dict[str, set[str]] = {}
    module = None
    for line in API_DOC.read_text().splitlines():
        heading = re.match(r"## `([\w.]+)`", line)
        if heading:
            module = (found.setdefault(heading.group(1), set()) and heading.group(1)) or heading.group(1)
            found.setdefault(module, set())
            continue
        row = re.match(r"\| `(\w+)` \| (.+) \|$", line)
        if row and module is not None:
            assert row.group(2).strip(" ?"), f"docs/api.md: {row.group(1)} has no description"
            found[module].add(row.group(1))
    return found


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_names_are_pinned(module: str) -> None:
    assert set(importlib.import_module(module).__all__) == PUBLIC[module]


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_is_described_in_the_api_page(module: str) -> None:
    assert _documented().get(module) == PUBLIC[module]


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_class_and_function_has_a_docstring(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in PUBLIC[module]
               if (inspect.isclass(obj := getattr(imported, name)) or inspect.isfunction(obj))
               and typing.get_origin(obj) is None and not inspect.getdoc(obj)]
    assert missing == []


def test_everything_else_is_private() -> None:
    """Outside the public modules, every module's name starts with `_`, or it is the `__init__` of a folder."""
    public = {name.removeprefix("durable_codemode.") for name in PUBLIC} | {"cli", "cli.__main__"}
    exposed = []
    for info in pkgutil.walk_packages(durable_codemode.__path__, prefix=""):
        name = info.name
        if name in public or name in FOLDERS or name.split(".")[0] == "apps":
            continue
        if not name.split(".")[-1].startswith("_"):
            exposed.append(name)
    assert exposed == []
