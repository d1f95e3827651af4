"""The worker's workflow runner, telling workflow code when each activation began (`workflow._task_clock`).

Temporal's deadlock detector gives an activation 2 s from its start, and a program's compute budget must count
from there (`SnippetLimits.max_feed_seconds`): wrapping the runner is the one place that sees an activation begin,
on the thread that runs it. It changes nothing an activation does or returns.
"""

from __future__ import annotations

import time

from temporalio.bridge.proto import workflow_activation as activation_pb
from temporalio.bridge.proto import workflow_completion as completion_pb
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails

from ..workflow._task_clock import activation_began
from ._runner_wrapping import ForwardingInstance, ForwardingRunner

__all__ = ["TaskTimingRunner"]


class _TimedInstance(ForwardingInstance):
    def activate(self, act: activation_pb.WorkflowActivation) -> completion_pb.WorkflowActivationCompletion:
        activation_began(time.monotonic())
        return self._inner.activate(act)


class TaskTimingRunner(ForwardingRunner):
    """Wraps a workflow runner; its instances record when each activation began, on the activation's thread."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _TimedInstance(self._inner.create_instance(det))
