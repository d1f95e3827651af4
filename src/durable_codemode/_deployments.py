"""Worker Deployment versions as runs see them: which version a run is pinned to, which one is current, moving one.

A worker started with `create_worker(deployment=...)` (`codemode worker --deployment NAME --build-id ID`) is one
version of a Temporal Worker Deployment. The run workflow declares itself `PINNED`: a run stays on the version whose
workers started it, with the spec, rules and stubs that version recorded, until it ends or someone moves it
(`move_run`, `codemode move`). New runs go to the deployment's current version, which an operator sets
(`temporal worker deployment set-current-version`). Temporal's visibility keeps each run's version in the system
search attribute `TemporalWorkerDeploymentVersion` as `NAME:BUILD_ID`, which `codemode runs` shows and filters by.
"""

from __future__ import annotations

from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode

from .shared._errors import CodeModeUserError

__all__ = ["VERSION_KEY", "VERSION_SEARCH_ATTRIBUTE", "current_version", "parse_version", "version_label"]

VERSION_SEARCH_ATTRIBUTE = "TemporalWorkerDeploymentVersion"
"""Temporal's own search attribute holding a versioned run's version, `NAME:BUILD_ID` (set by the server)."""

VERSION_KEY = SearchAttributeKey.for_keyword(VERSION_SEARCH_ATTRIBUTE)


def parse_version(text: str) -> WorkerDeploymentVersion:
    """`NAME:BUILD_ID` or `NAME.BUILD_ID` (Temporal's two spellings) as a version.

    Raises:
        CodeModeUserError: neither form, or a part is empty.

    """
    name, sep, build = text.partition(":")
    if not sep:
        name, sep, build = text.partition(".")
    if not sep or not name.strip() or not build.strip():
        raise CodeModeUserError(f"{text!r} is not a worker deployment version: give it as DEPLOYMENT:BUILD_ID, e.g. "
                                "ops:2026-12-06 (as `codemode runs` shows it)")
    return WorkerDeploymentVersion(deployment_name=name, build_id=build)


def version_label(version: WorkerDeploymentVersion) -> str:
    """`NAME:BUILD_ID`, as visibility and `codemode runs` show a version."""
    return f"{version.deployment_name}:{version.build_id}"


async def current_version(client: Client, deployment: str) -> WorkerDeploymentVersion | None:
    """The version of `deployment` that new runs go to; `None`: none is current (or the deployment is unknown)."""
    try:
        response = await client.workflow_service.describe_worker_deployment(DescribeWorkerDeploymentRequest(
            namespace=client.namespace, deployment_name=deployment))
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    current = response.worker_deployment_info.routing_config.current_deployment_version
    if not current.build_id:
        return None
    return WorkerDeploymentVersion(deployment_name=current.deployment_name or deployment, build_id=current.build_id)
