"""`python tests/_s3_replay.py HISTORY_FILE WORKFLOW_ID NAMESPACE`: replay one exported run with Temporal's `Replayer`.

The data converter is the one the environment configures (`data_converter(store_from_env(), encryption=...)`): with
`CODEMODE_PAYLOAD_STORE=s3://...` and the AWS settings, each reference in the history is read from S3 while the
workflow replays. Prints `replayed <workflow id>: <events> events, <n> payloads read from <store>, <m> offered to
it` and exits 0, or prints the failure and exits 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory
from temporalio.converter import (
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)
from temporalio.worker import Replayer

from durable_codemode import CodeModeRunWorkflow, data_converter, run_script
from durable_codemode._encryption import resolve_encryption
from durable_codemode._storage import store_from_env
from durable_codemode.worker._worker import workflow_runner


class Counting(StorageDriver):
    """The environment's store, counting the payloads the replay reads and offers to write through it.

    A replay encodes the commands it replays as a worker does, so a large activity argument goes to `store` again.
    The driver's key holds the namespace: replayed in the run's own, it finds the object there (a `HeadObject`) and
    writes nothing (in the Replayer's default, `ReplayNamespace`, it would write a copy).
    """

    def __init__(self, inner: StorageDriver) -> None:
        self.inner = inner
        self.read = 0
        self.offered = 0

    def name(self) -> str:
        return self.inner.name()

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        self.offered += len(payloads)
        return await self.inner.store(context, payloads)

    async def retrieve(self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
                       ) -> list[Payload]:
        self.read += len(claims)
        return await self.inner.retrieve(context, claims)


async def main(path: str, workflow_id: str, namespace: str) -> None:
    history = WorkflowHistory.from_json(workflow_id, Path(path).read_text())
    store = store_from_env()
    assert store is not None, "CODEMODE_PAYLOAD_STORE is not set"
    counting = Counting(store)
    converter = data_converter(counting, encryption=resolve_encryption(None))
    replayer = Replayer(workflows=[CodeModeRunWorkflow], workflow_runner=workflow_runner(), debug_mode=True,
                        namespace=namespace, data_converter=converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    if result.replay_failure is not None:
        print(f"replay failed: {result.replay_failure!r}", flush=True)
        raise SystemExit(1)
    print(f"replayed {history.workflow_id}: {len(history.events)} events, {counting.read} payloads read from "
          f"{store!r}, {counting.offered} offered to it", flush=True)


if __name__ == "__main__":
    run_script(main(sys.argv[1], sys.argv[2], sys.argv[3]))
