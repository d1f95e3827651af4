"""durable-codemode: code mode for LLM agents, made durable on Temporal.

An agent run is a Temporal workflow; the model's `run_code` programs run in the Monty sandbox inside workflow
code and replay deterministically; every tool call a program makes is a recorded activity.
"""

from ._encryption import EncryptionCodec, EncryptionError, EncryptionKeyError, EncryptionKeys
from ._process import run_script
from ._s3_store import PayloadNotFoundError, PayloadStoreAccessError, PayloadStoreError, S3PayloadStore
from ._storage import LocalPayloadStore, data_converter
from .client._connect import connect
from .client._deciding import decide, decide_all, pending_approvals, rejected_decisions, wait_for_approvals
from .client._devserver import start_dev_server
from .client._failures import RunWorkflowFailedError
from .client._run_agent import run_agent
from .client._runs import run_result, start_run, typed_result
from .client._signer import ApprovalSigner, generate_approver_key
from .client._stream import stream_events
from .shared._approvals import (
    ApprovalRecord,
    ApproverPolicy,
    DecidedCalls,
    PendingApproval,
    RejectedDecision,
)
from .shared._config import CatalogSettings, SnippetLimits, ToolOptions
from .shared._errors import (
    AgentNotFoundError,
    CodeModeError,
    CodeModeUserError,
    DecisionConflictError,
    DepsFactoryError,
    InvalidRunInputError,
    OutputChangedError,
    RunClosedError,
    RunFailedError,
    RunNotFoundError,
    TransientToolError,
    UnsupportedBehaviorVersionError,
    WorkerBusyError,
    WorkerUnavailableError,
)
from .shared._files import RunFiles
from .shared._records import CallRecord, RunResult, SnippetRecord, TurnRecord
from .shared._run_events import EventStreamSettings
from .shared._signing import ApproverKeyring
from .worker._agent import CodeModeAgent
from .worker._child_runs import add_child_run_tool, child_run_tool
from .worker._context import ToolCallContext, current_call
from .worker._pool import PoolSettings
from .worker._worker import CodeModePlugin, create_worker
from .workflow._run import CodeModeRunWorkflow

__all__ = [
    "AgentNotFoundError",
    "ApprovalRecord",
    "ApprovalSigner",
    "ApproverKeyring",
    "ApproverPolicy",
    "CallRecord",
    "CatalogSettings",
    "CodeModeAgent",
    "CodeModeError",
    "CodeModePlugin",
    "CodeModeRunWorkflow",
    "CodeModeUserError",
    "DecidedCalls",
    "DecisionConflictError",
    "DepsFactoryError",
    "EncryptionCodec",
    "EncryptionError",
    "EncryptionKeyError",
    "EncryptionKeys",
    "EventStreamSettings",
    "InvalidRunInputError",
    "LocalPayloadStore",
    "OutputChangedError",
    "PayloadNotFoundError",
    "PayloadStoreAccessError",
    "PayloadStoreError",
    "PendingApproval",
    "PoolSettings",
    "RejectedDecision",
    "RunClosedError",
    "RunFailedError",
    "RunFiles",
    "RunNotFoundError",
    "RunResult",
    "RunWorkflowFailedError",
    "S3PayloadStore",
    "SnippetLimits",
    "SnippetRecord",
    "ToolCallContext",
    "ToolOptions",
    "TransientToolError",
    "TurnRecord",
    "UnsupportedBehaviorVersionError",
    "WorkerBusyError",
    "WorkerUnavailableError",
    "add_child_run_tool",
    "child_run_tool",
    "connect",
    "create_worker",
    "current_call",
    "data_converter",
    "decide",
    "decide_all",
    "generate_approver_key",
    "pending_approvals",
    "rejected_decisions",
    "run_agent",
    "run_result",
    "run_script",
    "start_dev_server",
    "start_run",
    "stream_events",
    "typed_result",
    "wait_for_approvals",
]
