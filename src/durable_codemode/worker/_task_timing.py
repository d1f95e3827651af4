"""The worker's workflow runner, telling workflow code when each activation began (`workflow._task_clock`).

Temporal's deadlock detector gives an activation 2 s from its start, and a program's compute budget must count
from there (`SnippetLimits.max_feed_seconds`): wrapping the runner is the one place that sees an activation begin,
on the thread that runs it. It changes nothing an activation does or returns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from temporalio.bridge.proto import workflow_activation as activation_pb
from temporalio.bridge.proto import workflow_completion as completion_pb
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from ..workflow._task_clock import activation_began

__all__ = ["TaskTimingRunner"]


class _TimedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: activation_pb.WorkflowActivation) -> completion_pb.WorkflowActivationCompletion:
        activation_began(time.monotonic())
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class TaskTimingRunner(WorkflowRunner):
    """Wraps a workflow runner; its instances record when each activation began, on the activation's thread."""

    def __init__(self, inner: WorkflowRunner) -> None:
        self._inner = inner

    def prepare_workflow(self, defn: Any) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _TimedInstance(self._inner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Sequence[type[BaseException]]) -> None:
        self._inner.set_worker_level_failure_exception_types(types)
