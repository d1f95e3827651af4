"""Workflow runners that wrap another and only watch its activations: the forwarding the worker's wrappers share.

`create_worker` wraps the runner it is given (`_task_timing.TaskTimingRunner` always,
`_span_settling.SpanRecordingRunner` when tracing): each overrides only what it watches (`activate`,
`create_instance`) and forwards the rest here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio.bridge.proto import workflow_activation as activation_pb
from temporalio.bridge.proto import workflow_completion as completion_pb
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

__all__ = ["ForwardingInstance", "ForwardingRunner"]


class ForwardingInstance(WorkflowInstance):
    """A workflow instance that does what `inner` does; subclasses watch `activate`."""

    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: activation_pb.WorkflowActivation) -> completion_pb.WorkflowActivationCompletion:
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class ForwardingRunner(WorkflowRunner):
    """A workflow runner that does what `inner` does; subclasses wrap the instances of `create_instance`."""

    def __init__(self, inner: WorkflowRunner) -> None:
        self._inner = inner

    def prepare_workflow(self, defn: Any) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return self._inner.create_instance(det)

    def set_worker_level_failure_exception_types(self, types: Sequence[type[BaseException]]) -> None:
        self._inner.set_worker_level_failure_exception_types(types)
