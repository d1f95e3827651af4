"""At a worker's start: the runs that wait for a person on its task queue, and whether its keys can approve them.

A run that takes only signed decisions (`AgentSpec.signed_approvals`) is decided with the approver keys of whichever
worker holds it when the decision arrives. A worker deployed without an approver's key could not take that
approver's decisions: before, nobody learned it until a person's decision was refused. So a starting worker reads
the runs waiting for approval on its task queue (pinned to its own version when it is one), each one's recorded
spec, and logs, per run, the gated tools whose approvers it holds no key for: which run, which tool, which keys.

The waiting runs are found by visibility (`CodemodeStatus = 'waiting'`, or the `status` memo on a server without the
search attribute); nothing is asked of the runs themselves, so the check adds no workflow task to any run. It looks
at every gated tool of a run, not only the call that waits (which only a query could tell).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError

from .._deployments import VERSION_SEARCH_ATTRIBUTE, version_label
from .._history_events import read_run
from .._history_fetch import fetch_history
from .._visibility import STATUS_KEY, lacks_search_attributes, uses_search_attributes
from ..shared._names import STATUS_MEMO, STATUS_SEARCH_ATTRIBUTE, STATUS_WAITING, WORKFLOW_TYPE
from ..shared._results import printable
from ..shared._signing import ApproverKeyring
from ..shared._types import AgentSpec

__all__ = ["KeyProblem", "check_waiting_runs", "key_problems"]

logger = logging.getLogger("durable_codemode.worker")

_MAX_RUNS = 200
"""Waiting runs checked at most, per start: a worker's start is not the place to read a thousand histories."""


@dataclass(frozen=True)
class KeyProblem:
    """A gated tool of a run whose calls the keys at hand cannot (all) approve."""

    severity: Literal["error", "warning"]
    """`error`: no call of the tool can be approved with these keys; `warning`: some of its approvers lack one."""
    tool: str
    missing: tuple[str, ...]
    """The approvers without a key (empty: the keyring holds no key at all)."""
    what: str


def key_problems(spec: AgentSpec, keyring: ApproverKeyring) -> list[KeyProblem]:
    """Which of the run's gated tools the keys in `keyring` cannot approve (nothing for a run of unsigned decisions).

    A tool with an approver policy needs keys for at least `required` of its (recorded) approvers; one without
    takes any approver's signed decision, so it needs some key.
    """
    if not spec.signed_approvals:
        return []
    held = set(keyring.approvers())
    found = []
    for tool in spec.tools:
        if not (tool.requires_approval or tool.approval_rule):
            continue
        policy = tool.approvers
        if policy is None:
            if not held:
                found.append(KeyProblem(severity="error", tool=tool.name, missing=(), what=(
                    f"{tool.name}() calls need a signed decision, and no approver key is held: none can be approved")))
            continue
        missing = tuple(a for a in policy.approvers if a not in held)
        if not missing:
            continue
        able = len(policy.approvers) - len(missing)
        if able < policy.required:
            found.append(KeyProblem(severity="error", tool=tool.name, missing=missing, what=(
                f"{tool.name}() calls need {policy.describe()}; no key is held for {', '.join(missing)}, so none "
                "can be approved")))
        else:
            found.append(KeyProblem(severity="warning", tool=tool.name, missing=missing, what=(
                f"{tool.name}() calls need {policy.describe()}; no key is held for {', '.join(missing)} "
                f"({able} approvers keep one, enough for {policy.required})")))
    return found


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def _waiting_runs(client: Client, task_queue: str, version: WorkerDeploymentVersion | None) -> list[tuple[
        str, str]]:
    """(workflow id, run id) of the runs waiting for approval on `task_queue` (and `version`), newest first."""
    clauses = [f"WorkflowType = {_quoted(WORKFLOW_TYPE)}", "ExecutionStatus = 'Running'",
               f"TaskQueue = {_quoted(task_queue)}"]
    if version is not None:
        clauses.append(f"{VERSION_SEARCH_ATTRIBUTE} = {_quoted(version_label(version))}")
    indexed = uses_search_attributes(client)
    if indexed:
        try:
            query = " AND ".join([*clauses, f"{STATUS_SEARCH_ATTRIBUTE} = {_quoted(STATUS_WAITING)}"])
            return [(e.id, e.run_id) async for e in client.list_workflows(query, limit=_MAX_RUNS)]
        except RPCError as e:
            if not lacks_search_attributes(client, e):
                raise
    found = []
    async for execution in client.list_workflows(" AND ".join(clauses), limit=_MAX_RUNS * 5):
        status = execution.typed_search_attributes.get(STATUS_KEY) or (await execution.memo()).get(STATUS_MEMO)
        if status == STATUS_WAITING:
            found.append((execution.id, execution.run_id))
            if len(found) >= _MAX_RUNS:
                break
    return found


async def check_waiting_runs(client: Client, task_queue: str, keyring: ApproverKeyring,
                             version: WorkerDeploymentVersion | None = None) -> list[tuple[str, KeyProblem]]:
    """Each waiting run's key problems on this worker, as (run, problem); each is logged as a warning too.

    Best effort: a server that cannot be read, or a history that cannot, is logged and skipped.
    """
    try:
        runs = await _waiting_runs(client, task_queue, version)
    except Exception as e:  # the worker serves its runs either way
        logger.info("could not list the runs waiting for approval on %r: %s", task_queue, e)
        return []
    problems: list[tuple[str, KeyProblem]] = []
    for workflow_id, run_id in runs:
        try:
            spec = read_run(await fetch_history(client, workflow_id, run_id=run_id)).spec
        except Exception as e:
            logger.info("could not read the spec of run %s: %s", workflow_id, e)
            continue
        if spec is None:
            continue
        for problem in key_problems(spec, keyring):
            problems.append((workflow_id, problem))
            logger.warning("run %s waits for approval, and this worker cannot approve it all: %s. Give the worker "
                           "the approvers' public keys (approver_keys=..., --approver-keys FILE, "
                           "CODEMODE_APPROVER_KEYS) and restart it", printable(workflow_id), printable(problem.what))
    if problems:
        runs_named = sorted({r for r, _ in problems})
        keys = sorted({k for _, p in problems for k in p.missing})
        more = f" and {len(runs_named) - 20} more" if len(runs_named) > 20 else ""
        logger.warning("%d run(s) waiting on task queue %r need approver keys this worker does not hold%s: %s%s",
                       len(runs_named), task_queue, f" ({', '.join(keys)})" if keys else " (it holds none)",
                       printable(", ".join(runs_named[:20])), more)
    return problems


def start_check(client: Client, task_queue: str, keyring: ApproverKeyring,
                version: WorkerDeploymentVersion | None) -> asyncio.Task[list[tuple[str, KeyProblem]]]:
    """`check_waiting_runs` as a background task of the starting worker."""
    return asyncio.create_task(check_waiting_runs(client, task_queue, keyring, version),
                               name="durable-codemode waiting runs' keys")
