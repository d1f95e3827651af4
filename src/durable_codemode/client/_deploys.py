"""Moving an open run to another Worker Deployment version (`codemode move`): Temporal's versioning override.

What a version is, and how runs are pinned to one, is in `_deployments`; moving is a client's act on one run.
"""

from __future__ import annotations

from google.protobuf.field_mask_pb2 import FieldMask
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionMessage
from temporalio.api.enums.v1 import VersioningBehavior
from temporalio.api.workflow.v1 import VersioningOverride, WorkflowExecutionOptions
from temporalio.api.workflowservice.v1 import UpdateWorkflowExecutionOptionsRequest
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode

from .._deployments import version_label
from ..shared._errors import CodeModeUserError

__all__ = ["move_run"]


async def move_run(client: Client, run_id: str, to: WorkerDeploymentVersion) -> None:
    """Pin the open run `run_id` to version `to`: its next workflow task goes to that version's workers.

    Those workers rebuild the run by replaying its history with their code and go on with the spec the run recorded,
    so move a run only to a version whose code replays it and whose agents still fit its spec: `codemode move`
    checks both first (`check_deploy`, and an offline replay). The move is Temporal's versioning override; it is
    visible in the run's description and in `codemode runs`.

    Raises:
        CodeModeUserError: no such open run, or the server refused the override (it says why).

    """
    override = VersioningOverride(
        pinned=VersioningOverride.PinnedOverride(
            version=VersionMessage(deployment_name=to.deployment_name, build_id=to.build_id),
            behavior=VersioningOverride.PinnedOverrideBehavior.PINNED_OVERRIDE_BEHAVIOR_PINNED),
        # The fields servers before 1.28 read, as Temporal's own SDK still sends them.
        behavior=VersioningBehavior.VERSIONING_BEHAVIOR_PINNED, pinned_version=to.to_canonical_string())
    try:
        await client.workflow_service.update_workflow_execution_options(UpdateWorkflowExecutionOptionsRequest(
            namespace=client.namespace, workflow_execution=WorkflowExecution(workflow_id=run_id),
            workflow_execution_options=WorkflowExecutionOptions(versioning_override=override),
            update_mask=FieldMask(paths=["versioning_override"])))
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise CodeModeUserError(f"no open run {run_id!r} to move: `codemode runs --status running` lists them"
                                    ) from e
        raise CodeModeUserError(f"the server refused to move run {run_id!r} to {version_label(to)}: {e.message}"
                                ) from e
