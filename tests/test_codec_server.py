"""The codec server: Temporal's protocol (`POST /encode`, `/decode`, proto-JSON payloads), CORS, tokens, namespaces.

Requests are the shapes the Temporal UI sends (`X-Namespace`, `Content-Type`, an `Origin`, a preflight first) and the
`temporal` CLI sends (`--codec-endpoint`, `--codec-auth`); the last test points the real CLI at a real server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic_ai import Agent
from temporalio.api.common.v1 import Payload
from temporalio.testing import WorkflowEnvironment

from durable_codemode import CodeModeAgent, EncryptionCodec, EncryptionKeys, connect, start_run
from durable_codemode.client._devserver import temporal_cli_path
from durable_codemode.testing import RunCode, new_task_queue, running_worker, scripted_model
from durable_codemode.ui import codec_server_app
from durable_codemode.ui._codec_server import serve_codec_server

from .test_encrypted_runs import base64_texts

UI = "http://localhost:8233"
KEYS = EncryptionKeys.parse("k1:" + EncryptionKeys.new_key())
TOKEN = "t0ken-" + os.urandom(6).hex()


def wire(payload: Payload) -> dict[str, Any]:
    """A payload as the UI sends it: protobuf JSON, every metadata value and the data in base64."""
    return {"metadata": {k: base64.b64encode(v).decode() for k, v in payload.metadata.items()},
            "data": base64.b64encode(payload.data).decode()}


def from_wire(item: dict[str, Any]) -> Payload:
    return Payload(metadata={k: base64.b64decode(v) for k, v in item.get("metadata", {}).items()},
                   data=base64.b64decode(item.get("data", "")))


def secret(text: str = "the balance is 42") -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=f'"{text}"'.encode())


def ui_headers(**extra: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Namespace": "default", "Origin": UI,
            "Authorization": f"Bearer {TOKEN}", **extra}


@contextlib.asynccontextmanager
async def server(**options: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = codec_server_app(KEYS, **({"origins": [UI], "token": TOKEN} | options))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://codec") as http:
        yield http


async def test_decode_and_encode_answer_the_protocols_shapes_for_an_allowed_origin() -> None:
    sealed = EncryptionCodec(KEYS).encrypt([secret(), secret("other")])
    async with server() as http:
        answer = await http.post("/decode", json={"payloads": [wire(p) for p in sealed]}, headers=ui_headers())
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == UI
        assert [from_wire(p) for p in answer.json()["payloads"]] == [secret(), secret("other")]
        # A plaintext payload comes back as it is; encode seals, and the CLI's per-namespace path works too.
        encoded = await http.post("/default/encode", json={"payloads": [wire(secret())]}, headers=ui_headers())
        (item,) = encoded.json()["payloads"]
        assert base64.b64decode(item["metadata"]["encoding"]) == b"binary/encrypted"
        assert b"balance" not in base64.b64decode(item["data"])
        again = await http.post("/decode", json={"payloads": [item, wire(secret("plain"))]}, headers=ui_headers())
        assert [from_wire(p) for p in again.json()["payloads"]] == [secret(), secret("plain")]
        empty = await http.post("/decode", json={"payloads": []}, headers=ui_headers())
        assert empty.json() == {"payloads": []}


async def test_the_preflight_is_answered_for_the_ui_origins_only() -> None:
    async with server() as http:
        ok = await http.options("/decode", headers={
            "Origin": UI, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace,authorization"})
        assert ok.status_code == 204
        assert ok.headers["access-control-allow-origin"] == UI
        assert ok.headers["access-control-allow-credentials"] == "true"
        assert {h.strip().lower() for h in ok.headers["access-control-allow-headers"].split(",")} >= {
            "content-type", "x-namespace", "authorization"}
        other = await http.options("/decode", headers={"Origin": "https://evil.example",
                                                       "Access-Control-Request-Method": "POST"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


async def test_other_origins_missing_tokens_and_other_namespaces_are_refused_before_decrypting() -> None:
    (sealed,) = EncryptionCodec(KEYS).encrypt([secret()])
    body = {"payloads": [wire(sealed)]}
    async with server(namespaces={"default"}) as http:
        evil = await http.post("/decode", json=body, headers=ui_headers(Origin="https://evil.example"))
        assert evil.status_code == 403 and "balance" not in evil.text
        assert "access-control-allow-origin" not in evil.headers
        for auth in ("", "Bearer wrong", TOKEN):
            refused = await http.post("/decode", json=body, headers=ui_headers(Authorization=auth))
            assert refused.status_code == 401 and "Bearer" in refused.json()["error"], auth
        ns = await http.post("/decode", json=body, headers=ui_headers(**{"X-Namespace": "payments"}))
        assert ns.status_code == 403 and "'payments'" in ns.json()["error"]
        assert (await http.post("/payments/decode", json=body, headers=ui_headers())).status_code == 403
        # No Origin (the CLI, a script): no CORS needed, the token still is.
        cli = await http.post("/decode", json=body,
                              headers={"Authorization": f"Bearer {TOKEN}", "X-Namespace": "default"})
        assert cli.status_code == 200
    async with server(authorize=lambda headers: headers.get("authorization") == f"Bearer {TOKEN}",
                      token=None) as http:  # e.g. the UI user's access token, checked by the caller's function
        assert (await http.post("/decode", json=body, headers=ui_headers())).status_code == 200
        assert (await http.post("/decode", json=body, headers=ui_headers(Authorization="x"))).status_code == 403


async def test_an_unknown_key_or_a_malformed_body_is_a_400_that_says_why() -> None:
    (foreign,) = EncryptionCodec(EncryptionKeys.parse("k9:" + EncryptionKeys.new_key())).encrypt([secret()])
    async with server() as http:
        answer = await http.post("/decode", json={"payloads": [wire(foreign)]}, headers=ui_headers())
        assert answer.status_code == 400 and "encrypted with key 'k9'" in answer.json()["error"]
        assert answer.headers["access-control-allow-origin"] == UI  # the UI can read why
        bad = await http.post("/decode", content=b"{not json", headers=ui_headers())
        assert bad.status_code == 400 and "payloads" in bad.json()["error"]
        wrong = await http.post("/decode", json={"payloads": "not a list"}, headers=ui_headers())
        assert wrong.status_code == 400


def test_origins_and_tokens_are_checked_when_the_app_is_built() -> None:
    from durable_codemode import CodeModeUserError

    with pytest.raises(CodeModeUserError, match="must be scheme://host"):
        codec_server_app(KEYS, origins=["localhost:8233"])
    with pytest.raises(CodeModeUserError, match="token is empty"):
        codec_server_app(KEYS, token=" ")


async def test_the_temporal_cli_shows_an_encrypted_run_decoded_through_a_served_codec_server(
    env: WorkflowEnvironment,
) -> None:
    address = env.client.service_client.config.target_host
    client = await connect(address, encryption=KEYS)
    name = f"codec{os.urandom(3).hex()}"
    agent = Agent(scripted_model(RunCode("await lookup(key='gnu')"), lambda m: "done"), name=name)

    @agent.tool_plain
    def lookup(key: str) -> str:
        """A row."""
        return "wombat-8817"

    task_queue = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent)], task_queue=task_queue):
        handle = await start_run(client, name, "go", task_queue=task_queue)
        await handle.result()
    listening: asyncio.Queue[str] = asyncio.Queue()
    serving = asyncio.create_task(serve_codec_server(codec_server_app(KEYS, token=TOKEN), port=0,
                                                     announce=listening.put_nowait))
    try:
        url = await asyncio.wait_for(listening.get(), 30)
        show = [temporal_cli_path(), "workflow", "show", "--workflow-id", handle.id, "--address", address,
                "--output", "json"]
        plain = await asyncio.to_thread(subprocess.run, show, capture_output=True, text=True, check=True)
        assert "wombat-8817" not in base64_texts(plain.stdout)
        decoded = await asyncio.to_thread(subprocess.run, [*show, "--codec-endpoint", url, "--codec-auth",
                                                           f"Bearer {TOKEN}"], capture_output=True, text=True)
        assert decoded.returncode == 0, decoded.stderr
        assert "wombat-8817" in base64_texts(decoded.stdout)  # its payloads decoded by our server
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
