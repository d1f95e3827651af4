"""S3 as the shared payload store, against a real S3 server: moto's, in this process, on a free port.

One server for the module (`s3`), with IAM authentication on: every request is signed with a key moto issued, so
wrong credentials are refused as AWS refuses them. Each test writes under a prefix of its own. Worker processes are
forked (`tests/_forked`) with nothing but `CODEMODE_PAYLOAD_STORE=s3://...` and the AWS settings in their
environment, each in a directory of its own; the test process's own clients and workers get an `S3PayloadStore`
(or Temporal's plain `S3StorageDriver`) in code. Nothing is mocked: Temporal's dev server, Monty and the S3 server are
real; the model is scripted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aioboto3
import boto3
import pytest
from moto.server import ThreadedMotoServer
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.common import RetryPolicy
from temporalio.contrib.aws.s3driver import S3StorageDriver
from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client
from temporalio.converter import StorageDriverClaim, StorageDriverRetrieveContext
from temporalio.testing import WorkflowEnvironment

from durable_codemode import (
    CodeModeUserError,
    EncryptionKeys,
    PayloadNotFoundError,
    PayloadStoreAccessError,
    S3PayloadStore,
    ToolOptions,
    connect,
    decide,
    start_dev_server,
    start_run,
    wait_for_approvals,
)
from durable_codemode._encryption import is_encrypted
from durable_codemode._storage import store_from_env
from durable_codemode.testing import RunCode, new_task_queue, replay, running_worker

from ._agents import Effects, items_agent
from ._forked import run_codemode, run_script
from ._s3_worker import READY, REPORT_BYTES, expected, report_agent, report_text
from ._workers import WorkerProcess, start_worker_process
from .test_compute import SLOW_LOAD, TIGHT, echo
from .test_encrypted_runs import next_event

pytestmark = pytest.mark.xdist_group("s3-store")  # one moto server for the module, in one test process

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "codemode-payloads"
REGION = "eu-west-1"
MB = 1_000_000
DEADLOCK = "[TMPRL1101] Potential deadlock detected"


@dataclass
class S3:
    """The module's S3 server: where it listens, the bucket, the key moto issued, and an admin client."""

    url: str
    key_id: str
    secret: str
    admin: Any
    """A boto3 S3 client signed with the good key (for the tests' own looks at the bucket)."""

    def url_for(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def settings(self, prefix: str, **more: str) -> dict[str, str]:
        """A process's whole environment for the store `s3://BUCKET/prefix`: no other setting of this machine.

        The region is `AWS_REGION` (boto3 itself reads only `AWS_DEFAULT_REGION`): the bucket lives in eu-west-1,
        so a store that missed it would sign for another region and be refused.
        """
        return {"PATH": os.environ["PATH"], "CODEMODE_PAYLOAD_STORE": self.url_for(prefix),
                "AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_REGION": REGION,
                "AWS_ENDPOINT_URL": self.url, **more}

    def store(self, prefix: str, *, key_id: str | None = None, secret: str | None = None) -> S3PayloadStore:
        session = aioboto3.Session(aws_access_key_id=key_id or self.key_id,
                                   aws_secret_access_key=secret or self.secret, region_name=REGION)
        return S3PayloadStore(BUCKET, prefix=prefix, endpoint_url=self.url, session=session)

    def objects(self, prefix: str) -> dict[str, int]:
        """Key -> size of every object under `prefix`."""
        pages = self.admin.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def read(self, key: str) -> bytes:
        return bytes(self.admin.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _moto_auth(url: str, count: str) -> None:
    """Authenticate every S3 request after the next `count` ones (`inf`: none), through moto's own API."""
    request = urllib.request.Request(f"{url}/moto-api/reset-auth", data=count.encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        # Before authentication is on, any key will do: the bucket, and a user whose key every test signs with.
        setup = {"endpoint_url": url, "region_name": REGION, "aws_access_key_id": "setup",
                 "aws_secret_access_key": "setup"}
        boto3.client("s3", **setup).create_bucket(Bucket=BUCKET,
                                                  CreateBucketConfiguration={"LocationConstraint": REGION})
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="codemode")
        key = iam.create_access_key(UserName="codemode")["AccessKey"]
        iam.put_user_policy(UserName="codemode", PolicyName="payloads", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        _moto_auth(url, "0")
        admin = boto3.client("s3", endpoint_url=url, region_name=REGION, aws_access_key_id=key["AccessKeyId"],
                             aws_secret_access_key=key["SecretAccessKey"])
        yield S3(url, key["AccessKeyId"], key["SecretAccessKey"], admin)
    finally:
        with suppress(Exception):
            _moto_auth(url, "inf")
        server.stop()


def address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


def history_bytes(history: WorkflowHistory) -> int:
    return sum(e.ByteSize() for e in history.events)


def prefix_for(test: str) -> str:
    return f"{test}-{os.urandom(3).hex()}"


def _is(kind: EventType.ValueType) -> Callable[[HistoryEvent], bool]:
    return lambda event: event.event_type == kind


@asynccontextmanager
async def worker_process(env: WorkflowEnvironment, s3: S3, prefix: str, task_queue: str, identity: str,
                         home: Path) -> AsyncIterator[WorkerProcess]:
    """`tests._s3_worker` in a process of its own, whose directory, home and temp are `home`; stopped at the end."""
    (home / "tmp").mkdir(parents=True)
    worker = await start_worker_process(
        "tests._s3_worker", ["--address", address(env), "--task-queue", task_queue, "--identity", identity],
        identity=identity, logs=home, ready=READY,
        env=s3.settings(prefix, HOME=str(home), TMPDIR=str(home / "tmp")), cwd=home)
    try:
        yield worker
    finally:
        worker.stop()


def completed_by(history: WorkflowHistory) -> list[str]:
    return [e.workflow_task_completed_event_attributes.identity for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]


@pytest.mark.slow
async def test_two_worker_processes_share_only_s3_and_a_third_replays_from_it(
    env: WorkflowEnvironment, s3: S3, tmp_path: Path,
) -> None:
    prefix = prefix_for("two-hosts")
    client = await connect(address(env), payload_store=s3.store(prefix))
    task_queue = new_task_queue("s3")
    started = time.monotonic()
    async with worker_process(env, s3, prefix, task_queue, "host-a", tmp_path / "host-a") as a:
        handle = await start_run(client, "s3-report", "report", task_queue=task_queue)
        (pending,) = await wait_for_approvals(client, handle.id)  # host A ran make_report: 5 MB in S3
    assert not a.alive()
    async with worker_process(env, s3, prefix, task_queue, "host-b", tmp_path / "host-b"):
        # Host B has no cache of the run: it replays the history, reading the 5 MB result from S3, then goes on.
        await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
        result = await asyncio.wait_for(handle.result(), 240)
    elapsed = time.monotonic() - started
    assert eval(result.output) == {"result": expected()}
    history = await handle.fetch_history()
    assert set(completed_by(history)) == {"host-a", "host-b"}
    assert completed_by(history)[-1] == "host-b"

    # The history holds references; the bucket holds the payloads, under the prefix, as Temporal's driver keys them.
    assert history_bytes(history) < 100_000, history_bytes(history)
    objects = s3.objects(prefix)
    assert all(k.startswith(f"{prefix}/v0/ns/default/wt/durable-codemode.run/wi/") for k in objects), objects
    sizes = sorted(objects.values())
    assert sizes[-1] > REPORT_BYTES and sizes[-2] > 3 * MB, sizes  # the result, and the argument sent back
    biggest = max(objects, key=lambda k: objects[k])
    assert report_text(200).encode() in s3.read(biggest)  # not encrypted here (the encryption test checks)
    await replay(handle)

    # A third process, with only the S3 settings (no directory of either host), replays the exported history with
    # Temporal's Replayer, reading every reference from S3.
    exported = tmp_path / "history.json"
    exported.write_text(history.to_json())
    code, out, err = await asyncio.to_thread(run_script, ROOT / "tests" / "_s3_replay.py",
                                             [str(exported), history.workflow_id, client.namespace],
                                             env=s3.settings(prefix),
                                             cwd=tmp_path)
    assert code == 0 and f"replayed {history.workflow_id}" in out, (out, err)
    # It read the 5 MB result (what the workflow saw), and offered the 3 MB argument it re-encoded to the store,
    # which found it there (a replay writes nothing new).
    read, offered = (int(n) for n in re.findall(r"(\d+) (?:payloads read|offered)", out))
    assert read >= 1 and offered >= 1, out
    assert set(s3.objects(prefix)) == set(objects)
    print(f"\ntwo hosts: {len(history.events)} events, {history_bytes(history):,} bytes of history, objects "
          f"{[f'{s:,}' for s in sizes]}, run + stops {elapsed:.1f} s; third process: {out.strip()}")


DIGESTS = """import hashlib
digests = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(45_000)]
first = min(range(len(digests)), key=lambda i: digests[i])
"""
"""45,000 SHA-256 digests kept in the REPL: 2.9 MB of hex, which compresses only to half; built past the budget."""
FIRST_DIGEST = min(range(45_000), key=lambda i: hashlib.sha256(str(i).encode()).hexdigest())


@pytest.mark.slow
async def test_a_compute_escalation_carries_its_3_mb_repl_through_s3(env: WorkflowEnvironment, s3: S3) -> None:
    # As test_compute's sort past the budget, with S3 as the store and a REPL that compresses little: building the
    # digests goes past the in-workflow budget and on in the compute activity, whose input and result (the REPL's
    # dump, 2.5 MB compressed and encoded) are over what a history may hold, and come back to workflow code from S3.
    # (test_compute's 200k sorted rows make a 17 MB dump, whose load back into the live sandbox is what a loaded
    # machine slows: this REPL is about the store.)
    prefix = prefix_for("compute")
    client = await connect(address(env), payload_store=s3.store(prefix))
    effects = Effects()
    name = f"s3compute{os.urandom(3).hex()}"
    task_queue = new_task_queue("s3")
    program = RunCode(DIGESTS + "await get(i=first)")
    async with running_worker(client, [items_agent(name, program, echo, effects=effects, limits=TIGHT)],
                              task_queue=task_queue):
        handle = await start_run(client, name, "go", task_queue=task_queue)
        result = await asyncio.wait_for(handle.result(), 240)
    assert json.loads(result.output) == {"result": FIRST_DIGEST * 10}
    assert effects.calls == [("get", FIRST_DIGEST)]
    history = await handle.fetch_history()
    computes = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name == "durable-codemode.compute"]
    assert computes, "the stretch past the budget went on in the compute activity"
    # A workflow task may fail for time on a loaded machine and be retried, the outcome unchanged (asserted above):
    # a slow load of the REPL (test_compute's rule), or the 2 s deadlock detector while the workflow thread encodes
    # the compute activity's 2.5 MB input (seen at load 9 on 2 cores). Never for the store.
    failed = [e.workflow_task_failed_event_attributes.failure.message for e in history.events
              if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert all(SLOW_LOAD in m or DEADLOCK in m for m in failed), failed
    sizes = sorted(s3.objects(prefix).values())
    assert sizes and sizes[-1] > 2 * 1024 * 1024, sizes  # a REPL dump no history could hold
    assert history_bytes(history) < 200_000, history_bytes(history)
    await replay(handle)
    print(f"\ncompute: objects {[f'{s:,}' for s in sizes]}, history {history_bytes(history):,} bytes")


@pytest.mark.slow
async def test_encrypted_payloads_go_to_s3_as_ciphertext_and_a_command_replays_them(
    env: WorkflowEnvironment, s3: S3, tmp_path: Path,
) -> None:
    # In code, Temporal's own S3StorageDriver over an aioboto3 client of ours; in the command's process, the
    # environment's S3PayloadStore: they write and read the same references.
    spec = f"k1:{EncryptionKeys.new_key()}"
    keys = EncryptionKeys.parse(spec)
    session = aioboto3.Session(aws_access_key_id=s3.key_id, aws_secret_access_key=s3.secret, region_name=REGION)
    async with session.client("s3", endpoint_url=s3.url) as s3_client:
        driver = S3StorageDriver(client=new_aioboto3_client(s3_client), bucket=BUCKET)
        client = await connect(address(env), payload_store=driver, encryption=keys)
        task_queue = new_task_queue("s3")
        async with running_worker(client, [report_agent()], task_queue=task_queue, unsigned_approvals=True):
            handle = await start_run(client, "s3-report", "report", task_queue=task_queue)
            (pending,) = await wait_for_approvals(client, handle.id)
            await decide(client, handle.id, pending.call_id, approved=True, approver="ana")
            result = await asyncio.wait_for(handle.result(), 240)
        assert eval(result.output) == {"result": expected()}
        await replay(handle)
    # Temporal's driver has no prefix: the run's objects are under its workflow id.
    objects = s3.objects(f"v0/ns/default/wt/durable-codemode.run/wi/{handle.id}/")
    assert len(objects) >= 2 and max(objects.values()) > REPORT_BYTES, objects
    for key in objects:
        stored = Payload.FromString(s3.read(key))
        assert is_encrypted(stored), key
        assert report_text(200).encode() not in stored.data

    # The history as the server stores it (references and ciphertext), replayed by `codemode replay` in a process
    # that has the S3 settings and the key, and nothing else.
    raw = await (await connect(address(env), encryption=False)).get_workflow_handle(handle.id).fetch_history()
    exported = tmp_path / "encrypted.json"
    exported.write_text(raw.to_json())
    code, out, err = await run_codemode(["replay", "--history", str(exported)], cwd=tmp_path,
                                        env=s3.settings("", CODEMODE_ENCRYPTION_KEYS=spec))
    assert code == 0, (out, err)


async def test_wrong_credentials_are_named_and_the_activity_retries_until_a_worker_has_good_ones(
    env: WorkflowEnvironment, s3: S3,
) -> None:
    prefix = prefix_for("credentials")
    good = await connect(address(env), payload_store=s3.store(prefix))
    bad = await connect(address(env), payload_store=s3.store(prefix, key_id="AKIAWRONGWRONGWRONG0", secret="nope"))
    retry = RetryPolicy(initial_interval=timedelta(milliseconds=200), backoff_coefficient=1.0, maximum_attempts=1000)
    agent = report_agent(tool_options={"make_report": ToolOptions(retry_policy=retry)})
    task_queue = new_task_queue("s3")
    async with running_worker(bad, [agent], task_queue=task_queue, unsigned_approvals=True):
        handle = await start_run(good, "s3-report", "report", task_queue=task_queue)
        failure = await _activity_failure(handle, attempts=2)
    assert failure.application_failure_info.type == "PayloadStoreAccessError", failure
    message = failure.message
    assert f"s3://{BUCKET}/{prefix}/v0/ns/default/" in message and "403" in message, message
    assert "AWS_ACCESS_KEY_ID" in message and "s3:PutObject" in message, message
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING  # the run waits, not failed

    # The bad credentials read nothing either: an object the run wrote, read back with them.
    async with running_worker(good, [report_agent(tool_options={"make_report": ToolOptions(retry_policy=retry)})],
                              task_queue=task_queue, unsigned_approvals=True):
        (pending,) = await wait_for_approvals(good, handle.id)
        await decide(good, handle.id, pending.call_id, approved=True, approver="ana")
        result = await asyncio.wait_for(handle.result(), 240)
    assert eval(result.output) == {"result": expected()}
    history = await handle.fetch_history()
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert max(attempts) >= 2, attempts
    await replay(handle)

    (claim_key, _) = max(s3.objects(prefix).items(), key=lambda item: item[1])
    with pytest.raises(PayloadStoreAccessError, match="InvalidAccessKeyId") as refused:
        await s3.store(prefix, key_id="AKIAWRONGWRONGWRONG0", secret="nope").retrieve(
            StorageDriverRetrieveContext(), [StorageDriverClaim(claim_data={
                "bucket": BUCKET, "key": claim_key, "hash_algorithm": "sha256", "hash_value": "0" * 64})])
    assert "check the credentials" in str(refused.value)


async def _activity_failure(handle: WorkflowHandle[Any, Any], *, attempts: int) -> Any:
    """The last failure of the run's pending activity once it has failed `attempts` times (only one fails here)."""
    async with asyncio.timeout(60):
        while True:
            for activity in (await handle.describe()).raw_description.pending_activities:
                if activity.attempt > attempts and activity.HasField("last_failure"):
                    return activity.last_failure
            await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_missing_object_is_named_and_the_run_waits_until_it_is_back(env: WorkflowEnvironment, s3: S3) -> None:
    prefix = prefix_for("missing")
    client = await connect(address(env), payload_store=s3.store(prefix))
    task_queue = new_task_queue("s3")
    async with running_worker(client, [report_agent()], task_queue=task_queue, unsigned_approvals=True):
        handle = await start_run(client, "s3-report", "report", task_queue=task_queue)
        (pending,) = await wait_for_approvals(client, handle.id)
    # The worker is gone, and so is the run's 5 MB result (a lifecycle rule, say).
    objects = s3.objects(prefix)
    gone = max(objects, key=lambda k: objects[k])
    body = s3.read(gone)
    s3.admin.delete_object(Bucket=BUCKET, Key=gone)

    async with running_worker(client, [report_agent()], task_queue=task_queue, unsigned_approvals=True):
        # A new worker holds no cache of the run: to take the decision it replays the history, and needs the object.
        deciding = asyncio.create_task(decide(client, handle.id, pending.call_id, approved=True, approver="ana",
                                              timeout=timedelta(seconds=90)))
        failed = await next_event(client, handle.id, _is(EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED))
        message = failed.workflow_task_failed_event_attributes.failure.message
        assert f"payload s3://{BUCKET}/{gone}" in message and "is not in the payload store" in message, message
        assert "Put the object back" in message, message
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        with pytest.raises(PayloadNotFoundError):  # any reader of the object is told the same
            await s3.store(prefix).retrieve(StorageDriverRetrieveContext(), [_claim(gone, body)])
        await asyncio.to_thread(s3.admin.put_object, Bucket=BUCKET, Key=gone, Body=body)
        await deciding
        result = await asyncio.wait_for(handle.result(), 240)
    assert eval(result.output) == {"result": expected()}
    await replay(handle)


def _claim(key: str, body: bytes) -> StorageDriverClaim:
    return StorageDriverClaim(claim_data={"bucket": BUCKET, "key": key, "hash_algorithm": "sha256",
                                          "hash_value": hashlib.sha256(body).hexdigest()})


@pytest.mark.parametrize(("value", "told"), [
    ("s3://", "names no bucket"),
    ("s3:///prefix", "names no bucket"),
    ("gs://bucket/prefix", "neither a local directory nor an s3:// URL"),
    ("s3://Payloads_Bucket/x", "is not an S3 bucket name"),
    ("s3://codemode-payloads/x?region=eu-west-1", "has a query or a fragment"),
])
def test_a_malformed_store_url_is_refused_by_name(value: str, told: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEMODE_PAYLOAD_STORE", value)
    with pytest.raises(CodeModeUserError, match=told) as refused:
        store_from_env()
    assert f"CODEMODE_PAYLOAD_STORE={value!r}" in str(refused.value)


def test_without_aioboto3_the_s3_store_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aioboto3", None)  # as if not installed: `import aioboto3` raises
    monkeypatch.setenv("CODEMODE_PAYLOAD_STORE", "s3://codemode-payloads/runs")
    with pytest.raises(CodeModeUserError, match=r"needs aioboto3, which is not installed") as refused:
        store_from_env()
    assert "pip install 'durable-codemode[s3]'" in str(refused.value)


async def test_the_environment_gives_every_client_and_the_dev_server_the_s3_store(
    env: WorkflowEnvironment, s3: S3, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in s3.settings("from-env/runs/").items():
        monkeypatch.setenv(name, value)
    client = await connect(address(env))
    async with await start_dev_server(banner="off") as dev:
        for converter in (client.data_converter, dev.client.data_converter):
            assert converter.external_storage is not None
            (store,) = converter.external_storage.drivers
            assert isinstance(store, S3PayloadStore)
            assert (store.bucket, store.prefix, store.name()) == (BUCKET, "from-env/runs", "aws.s3driver")
