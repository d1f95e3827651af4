"""Before a deploy: what the new code would break in each open run, which replay cannot see (`codemode check-deploy`).

A replay checks the workflow code, and no activity code runs in it: a tool that is gone replays cleanly, and fails
only when the run calls it live. Each run recorded its agent when it started (`AgentSpec`: tools, stubs, output,
approval rules and policies), so the check compares that record with what the new code's agents would record for the
same run (`worker/_describe.describe_for_check`: its deps, instructions and prompt; no hook runs), and with the keys
the new workers would hold. Per run, each difference is a finding:

- `error`: the run would fail or stall on the new code: a tool gone (the programs it runs may still call it), a
  parameter renamed, retyped, or newly required, a direct tool's schema changed, the output changed (an answer made
  for the recorded one may be refused, `OutputChangedError`), a run of behaviour version 1 whose approval rule changed
  or went (its replay asks the rule again: it diverges or wedges), approver keys no longer held by enough approvers
  for a gated tool's calls to be signed, the agent gone;
- `warning`: the run goes on, differently: a rule changed or gone in a run that records its verdicts (its calls
  from now on are judged by the new rule, or sent to a person), a result type changed (a program written for the old
  one may read the new one wrong), an approver who lost a key where enough keep one, the run's deps not buildable
  here.

Settings a run recorded (timeouts, retry policies, `requires_approval`, approver policies, limits) are its own and do
not change with a deploy, so they are not compared.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from temporalio.client import Client, WorkflowHistory

from .._deployments import VERSION_KEY
from .._history_events import read_run
from .._history_fetch import fetch_history
from ..shared._names import WORKFLOW_TYPE
from ..shared._results import clip, printable
from ..shared._signing import ApproverKeyring
from ..shared._types import RECORDED_RULE_VERDICTS, AgentSpec, ToolSpec
from ..worker._agent import CodeModeAgent
from ..worker._describe import describe_for_check
from ..worker._rules import rule_fingerprint
from ..worker._waiting_runs import key_problems
from ..workflow._fingerprints import recorded_output

__all__ = ["DeployCheck", "Finding", "RunCheck", "check_deploy", "check_history", "compare_specs", "findings_json",
           "render_deploy_check"]

_FINDING_CHARS = 700
"""A finding's words are bounded: tool names, signatures and types come from the run's record (an MCP server's
schemas, say), so one could otherwise be as long as its stubs."""

Severity = Literal["error", "warning"]


@dataclass(kw_only=True)
class Finding:
    """One difference between what a run recorded and the new code."""

    severity: Severity
    subject: str
    """What differs: `tool 'notify'`, `output`, `approval rule of 'transfer'`, `approver keys`, `agent`."""
    what: str
    """The difference, what it does to the run, and what to do."""


@dataclass(kw_only=True)
class RunCheck:
    """One open run against the new code."""

    workflow_id: str
    run_id: str
    agent: str
    started_at: datetime | None = None
    version: str | None = None
    """The Worker Deployment version the run is pinned to, `NAME:BUILD_ID` (`None`: unversioned)."""
    behavior_version: int | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def breaks(self) -> bool:
        """Whether the new code would break the run (some finding is an error)."""
        return any(f.severity == "error" for f in self.findings)


@dataclass(kw_only=True)
class DeployCheck:
    """Every open run checked, and the agents of the new code."""

    agents: list[str]
    runs: list[RunCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No run would break (warnings allowed)."""
        return not any(r.breaks for r in self.runs)


# -- stubs: a sandbox tool's signature, as the run's programs were checked against it --------------------------------


@dataclass(frozen=True)
class _Signature:
    params: dict[str, tuple[str | None, bool]]
    """Each parameter: its annotation's source and whether it has a default."""
    returns: str | None
    types: dict[str, str]
    """The stub module's classes (TypedDicts) by name: their fields' source, to compare what annotations name."""

    def text(self, name: str) -> str:
        shown = [f"{p}: {a}" + (" = ..." if default else "") for p, (a, default) in self.params.items()]
        return f"{name}({', '.join(shown)}) -> {self.returns}"


def _signatures(stubs: str) -> dict[str, _Signature]:
    """Every `async def` of a run's stubs, by name (empty when the stubs do not parse)."""
    try:
        tree = ast.parse(stubs)
    except SyntaxError:
        return {}
    types = {node.name: "; ".join(ast.unparse(s) for s in node.body if not isinstance(s, ast.Expr))
             for node in tree.body if isinstance(node, ast.ClassDef)}
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
            params = {a.arg: (ast.unparse(a.annotation) if a.annotation else None, d is not None)
                      for a, d in zip(positional, defaults, strict=True)}
            params |= {a.arg: (ast.unparse(a.annotation) if a.annotation else None, d is not None)
                       for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)}
            found[node.name] = _Signature(params=params, returns=ast.unparse(node.returns) if node.returns else None,
                                          types=types)
    return found


def _named_types(annotation: str | None, sig: _Signature) -> set[str]:
    """The stub classes an annotation names, and those their fields name, transitively."""
    if not annotation:
        return set()
    try:
        names = {n.id for n in ast.walk(ast.parse(annotation, mode="eval")) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()
    found = {n for n in names if n in sig.types}
    for name in list(found):
        found |= _named_types(sig.types[name].replace(";", ","), sig) if sig.types[name] else set()
    return found


def _type_changed(annotation: str | None, old: _Signature, new: _Signature) -> list[str]:
    """The classes an annotation names whose fields changed between the two stubs."""
    return sorted(n for n in _named_types(annotation, old) if new.types.get(n) != old.types.get(n))


def _compare_sandbox_tool(tool: str, old: _Signature, new: _Signature) -> list[Finding]:
    subject = f"tool {tool!r}"
    findings = []
    now = f"it is now {new.text(tool)}"
    for name, (annotation, _default) in old.params.items():
        if name not in new.params:
            findings.append(Finding(severity="error", subject=subject, what=(
                f"parameter {name!r} is gone (renamed?): the run's programs were written and type-checked against "
                f"{old.text(tool)}, and a call passing {name}= fails; {now}")))
            continue
        new_annotation = new.params[name][0]
        changed = _type_changed(annotation, old, new)
        if new_annotation != annotation or changed:
            what = f"parameter {name!r} was {annotation}, now {new_annotation}"
            if changed:
                what += f" (type {', '.join(changed)} changed its fields)"
            findings.append(Finding(severity="error", subject=subject, what=(
                f"{what}: a call made for the recorded signature may fail validation; {now}")))
    for name, (_annotation, default) in new.params.items():
        if name not in old.params and not default:
            findings.append(Finding(severity="error", subject=subject, what=(
                f"new required parameter {name!r}: calls made for the recorded signature ({old.text(tool)}) lack it "
                "and fail validation")))
    returns_changed = _type_changed(old.returns, old, new)
    if new.returns != old.returns or returns_changed:
        findings.append(Finding(severity="warning", subject=subject, what=(
            f"it returned {old.returns}, now {new.returns}"
            + (f" (type {', '.join(returns_changed)} changed its fields)" if returns_changed else "")
            + ": a program written for the old result may read the new one wrong")))
    return findings


# -- comparing a run's record with the new code --------------------------------------------------------------------


def _rule_findings(tool: ToolSpec, spec: AgentSpec, agent: CodeModeAgent) -> list[Finding]:
    if not tool.approval_rule:
        return []
    subject = f"approval rule of {tool.name!r}"
    rule = agent.approval_rule_for(tool.name)
    records = spec.behavior_version >= RECORDED_RULE_VERDICTS
    if rule is None:
        if records:
            return [Finding(severity="warning", subject=subject, what=(
                "gone in the new code: the run's recorded verdicts stand, and each call of the tool it makes from now "
                "on waits for a person (the verdict a worker without the rule gives)"))]
        return [Finding(severity="error", subject=subject, what=(
            "gone in the new code, and this run asks the rule again on every replay (behaviour version 1): on a "
            "worker without it the run's workflow tasks fail and it waits until the old code serves it. Keep the run "
            "on the version that started it (a pinned deploy), or keep the rule until such runs are done"))]
    if tool.rule_fingerprint is None:
        if records:
            return []
        return [Finding(severity="warning", subject=subject, what=(
            "this run was recorded before rules were fingerprinted, so whether the rule changed cannot be told, and "
            "it asks the rule again on every replay (behaviour version 1): check that it replays with the new code "
            "(`codemode replay RUN_ID --worker MODULE`)"))]
    if rule_fingerprint(rule) == tool.rule_fingerprint:
        return []
    if records:
        return [Finding(severity="warning", subject=subject, what=(
            "changed since the run started: its recorded verdicts stand, and the calls it makes from now on are "
            "judged by the new rule"))]
    return [Finding(severity="error", subject=subject, what=(
        "changed since the run started, and this run asks the rule again on every replay (behaviour version 1): "
        "where the new rule judges a call otherwise, its replay diverges and the run wedges (`codemode replay` names "
        "the rule). Keep the run on the version that started it (a pinned deploy), or the old rule until such runs "
        "are done"))]


def _key_findings(spec: AgentSpec, keyring: ApproverKeyring | None) -> list[Finding]:
    if keyring is None:
        return []
    return [Finding(severity=p.severity, subject="approver keys", what=(
        p.what.replace("no key is held", "the new workers hold no key").replace(
            "no approver key is held", "the new workers hold no approver key")))
        for p in key_problems(spec, keyring)]


def compare_specs(old: AgentSpec, new: AgentSpec, agent: CodeModeAgent,
                  keyring: ApproverKeyring | None = None) -> list[Finding]:
    """What the new code would change for a run that recorded `old` (`new`: what the new code records for it)."""
    findings: list[Finding] = []
    new_tools = {t.name: t for t in new.tools}
    old_sigs, new_sigs = _signatures(old.stubs), _signatures(new.stubs)
    old_direct = {d.name: d for d in old.model_tools}
    new_direct = {d.name: d for d in new.model_tools}
    for tool in old.tools:
        subject = f"tool {tool.name!r}"
        current = new_tools.get(tool.name)
        if current is None:
            how = "the run's programs may still call it (its stubs offer it)" if tool.in_sandbox else (
                "the model may still call it directly (the run offers it)")
            findings.append(Finding(severity="error", subject=subject, what=(
                f"gone in the new code: {how}, and each call fails on the new workers. Keep it (or an alias) until "
                "such runs are done, or keep them on the version that started them")))
            continue
        if current.in_sandbox != tool.in_sandbox:
            findings.append(Finding(severity="error", subject=subject, what=(
                f"moved {'out of' if tool.in_sandbox else 'into'} the sandbox: the run "
                f"{'calls it from programs' if tool.in_sandbox else 'offers it to the model directly'}, as it "
                "recorded")))
        elif tool.in_sandbox and tool.name in old_sigs and tool.name in new_sigs:
            findings += _compare_sandbox_tool(tool.name, old_sigs[tool.name], new_sigs[tool.name])
        elif not tool.in_sandbox and tool.name in old_direct and tool.name in new_direct and (
                old_direct[tool.name].parameters_json_schema != new_direct[tool.name].parameters_json_schema):
            findings.append(Finding(severity="error", subject=subject, what=(
                "its argument schema changed: the model is offered the recorded one, and calls made for it may fail "
                "validation on the new workers")))
        findings += _rule_findings(tool, old, agent)
    was, now = recorded_output(old.output), recorded_output(new.output)
    if was.fingerprint != now.fingerprint:
        findings.append(Finding(severity="error", subject="output", what=(
            f"the run ends with {was.summary()}; the new agent has {now.summary()}. The run offers its model the "
            "recorded output, so an answer the new one rejects fails the run (OutputChangedError), and a client "
            "reading the output as the new type may not read it")))
    findings += _key_findings(old, keyring)
    return findings


async def check_history(history: WorkflowHistory, agents: Sequence[CodeModeAgent], *,
                        keyring: ApproverKeyring | None = None) -> RunCheck:
    """Check one run's latest history against `agents` (the new code), offline."""
    recorded = read_run(history)
    spec = recorded.spec
    check = RunCheck(workflow_id=history.workflow_id, run_id=history.run_id, agent=recorded.input.agent,
                     behavior_version=spec.behavior_version if spec else None)
    if spec is None:
        check.findings.append(Finding(severity="warning", subject="spec", what=(
            "the run has not recorded its spec yet (its first step has not run): nothing to compare")))
        return check
    agent = next((a for a in agents if a.name == spec.agent), None)
    if agent is None:
        served = ", ".join(sorted(a.name for a in agents)) or "none"
        check.findings.append(Finding(severity="error", subject="agent", what=(
            f"the new code serves no agent {spec.agent!r} (it serves: {served}): every later step of the run fails "
            "on its workers (AgentNotFoundError)")))
        return check
    run_input = recorded.input
    try:
        new, note = await describe_for_check(agent, run_input.deps, deps_type=run_input.deps_type,
                                             instructions=run_input.instructions, prompt=run_input.prompt)
    except Exception as e:
        check.findings.append(Finding(severity="error", subject="agent", what=(
            f"the new code cannot describe agent {spec.agent!r} for this run: {type(e).__name__}: {e}")))
        return check
    if note is not None:
        check.findings.append(Finding(severity="warning", subject="deps", what=note))
    check.findings += compare_specs(spec, new, agent, keyring)
    return check


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def check_deploy(client: Client, agents: Sequence[CodeModeAgent], *, query: str | None = None,
                       limit: int = 500, keyring: ApproverKeyring | None = None) -> DeployCheck:
    """Check every open run (`query`: a visibility query ANDed, e.g. `"TaskQueue = 'ops'"`) against `agents`.

    Args:
        client: The server's client.
        agents: The new code's agents (`import_agents(MODULE)` gives a module's).
        query: Narrows the open runs checked.
        limit: At most this many runs, newest first.
        keyring: The approver keys the new workers will hold; `None`: keys are not checked.

    """
    clauses = [f"WorkflowType = {_quote(WORKFLOW_TYPE)}", "ExecutionStatus = 'Running'"]
    if query:
        clauses.append(f"({query})")
    result = DeployCheck(agents=sorted(a.name for a in agents))
    async for execution in client.list_workflows(" AND ".join(clauses), limit=limit):
        history = await fetch_history(client, execution.id, run_id=execution.run_id)
        check = await check_history(history, agents, keyring=keyring)
        check.started_at = execution.start_time
        check.version = execution.typed_search_attributes.get(VERSION_KEY) or None
        result.runs.append(check)
    return result


def render_deploy_check(check: DeployCheck, *, module: str | None = None) -> str:
    """The check as text: one block per run (its findings), then a count; every line escaped (`printable`)."""
    lines = []
    against = f"{module} (agents: {', '.join(check.agents)})" if module else ", ".join(check.agents)
    if not check.runs:
        return printable(f"no open runs to check against {against}")
    lines.append(f"checked {len(check.runs)} open run{'s' if len(check.runs) != 1 else ''} against {against}")
    for run in check.runs:
        where = ", ".join(x for x in (
            f"agent {run.agent}", f"version {run.version}" if run.version else None,
            f"behaviour version {run.behavior_version}" if run.behavior_version is not None else None,
            f"started {run.started_at:%Y-%m-%d %H:%M}" if run.started_at else None) if x)
        errors = sum(f.severity == "error" for f in run.findings)
        verdict = ("WOULD BREAK" if errors else "ok, with warnings" if run.findings else "ok")
        lines.append(f"run {run.workflow_id} ({where}): {verdict}")
        for finding in run.findings:
            lines.append(f"  {finding.severity:<8} {clip(f'{finding.subject}: {finding.what}', _FINDING_CHARS)}")
    breaking = sum(r.breaks for r in check.runs)
    lines.append(f"{len(check.runs)} runs: {breaking} would break, {len(check.runs) - breaking} ok")
    return "\n".join(printable(line) for line in lines)


def findings_json(check: DeployCheck) -> str:
    """The check as JSON (for `codemode check-deploy --json`)."""
    return json.dumps({"agents": check.agents, "ok": check.ok, "runs": [
        {"workflow_id": r.workflow_id, "run_id": r.run_id, "agent": r.agent, "version": r.version,
         "behavior_version": r.behavior_version, "breaks": r.breaks,
         "started_at": r.started_at.isoformat() if r.started_at else None,
         "findings": [{"severity": f.severity, "subject": f.subject, "what": f.what} for f in r.findings]}
        for r in check.runs]}, indent=2, default=_json_default)


def _json_default(value: Any) -> str:
    return str(value)
