"""A codec server: the Temporal UI and `temporal` CLI read encrypted runs through it (`codemode codec-server`).

Temporal's codec server protocol: `POST /encode` and `POST /decode` (also under a namespace, `/{namespace}/decode`,
as the CLI's `--codec-endpoint` templating sends them), each taking and answering JSON `{"payloads": [...]}` with
payloads in protobuf's JSON form (`metadata` values and `data` in base64). The UI sends the namespace in
`X-Namespace`, and, with "pass the user access token" on, its user's token in `Authorization`.

Who may use it:
- Browsers: only the UI origins given (`origins`, exact `scheme://host:port`), with a CORS preflight; a request from
  any other origin is refused before anything is decrypted.
- A bearer token (`token`), compared in constant time: what `temporal workflow show --codec-auth 'Bearer ...'` and
  scripts send. The UI cannot send a fixed token: behind an identity provider, check the UI user's token with
  `authorize` (a function of the request's headers); on one machine, serve loopback only with no token.
- `namespaces`: the namespaces whose payloads it answers for (`X-Namespace`, or the path's); default: any.
A payload it cannot decode (a key it does not hold) fails the request with the codec's message, naming the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import socket
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

import uvicorn
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from .._encryption import EncryptionCodec, EncryptionKeys
from ..shared._errors import CodeModeError, CodeModeUserError

__all__ = ["CODEC_SERVER_MAX_BODY", "CODEC_TOKEN_ENV", "DEFAULT_CODEC_PORT", "codec_server_app", "serve_codec_server"]

CODEC_SERVER_MAX_BODY = 64 * 1024 * 1024
"""The largest request body answered (bytes): a page of a history's payloads, each at most Temporal's 2 MiB."""

DEFAULT_CODEC_PORT = 8888
"""Where `codemode codec-server` listens unless told otherwise."""

CODEC_TOKEN_ENV = "CODEMODE_CODEC_TOKEN"
"""The bearer token `codemode codec-server` requires, when set (from the environment: never on a command line)."""

_ALLOWED_HEADERS = "Authorization, Content-Type, X-Namespace"


def codec_server_app(
    codec: PayloadCodec | EncryptionKeys,
    *,
    origins: Sequence[str] = (),
    token: str | None = None,
    authorize: Callable[[Mapping[str, str]], bool] | None = None,
    namespaces: Collection[str] | None = None,
) -> Starlette:
    """An ASGI app answering Temporal's codec server protocol with `codec` (or our codec with these keys).

    Args:
        codec: the codec, or `EncryptionKeys` for durable-codemode's encryption codec.
        origins: the Temporal UI origins browsers may call it from (e.g. `https://temporal.example.com`, or the dev
            server's `http://localhost:8233`); none: browsers are refused, the CLI and scripts are not.
        token: a bearer token every request must carry (`Authorization: Bearer <token>`); `None`: none needed.
        authorize: decides, from a request's headers, whether it may be answered (e.g. checks the UI user's access
            token with your identity provider); runs after the token check.
        namespaces: the namespaces it answers for; `None`: any.

    Example:
        ```python
        app = codec_server_app(EncryptionKeys.parse("k1:" + EncryptionKeys.new_key()),
                               origins=["http://localhost:8233"], token="s3cret")
        ```

    Raises:
        CodeModeUserError: an origin that is not `scheme://host[:port]`, or an empty token.

    """
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
            raise CodeModeUserError(f"the UI origin {origin!r} must be scheme://host[:port], as a browser sends it "
                                    "(e.g. http://localhost:8233), with no path")
    if token is not None and not token.strip():
        raise CodeModeUserError("the codec server's token is empty: give one, or token=None for none")
    payload_codec = EncryptionCodec(codec) if isinstance(codec, EncryptionKeys) else codec
    allowed = frozenset(origins)
    expected = f"Bearer {token}".encode() if token is not None else None

    def cors(request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is None or origin not in allowed:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true", "Vary": "Origin"}

    def refused(request: Request, status: int, message: str) -> Response:
        return JSONResponse({"error": message}, status_code=status, headers=cors(request))

    def problem(request: Request, namespace: str | None) -> Response | None:
        origin = request.headers.get("origin")
        if origin is not None and origin not in allowed:
            return refused(request, 403, f"origin {origin!r} may not use this codec server (it allows "
                                         f"{', '.join(sorted(allowed)) or 'no browser origin'})")
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return refused(request, 401, "a bearer token is required (Authorization: Bearer <token>)")
        if authorize is not None and not authorize(dict(request.headers)):
            return refused(request, 403, "not authorized")
        if namespaces is not None and namespace not in namespaces:
            return refused(request, 403, f"namespace {namespace!r} is not served here")
        return None

    async def preflight(request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin is None or origin not in allowed:
            return Response(status_code=403)
        return Response(status_code=204, headers={
            **cors(request), "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": _ALLOWED_HEADERS, "Access-Control-Max-Age": "600"})

    def endpoint(direction: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            if request.method == "OPTIONS":
                return await preflight(request)
            namespace = request.path_params.get("namespace") or request.headers.get("x-namespace")
            refusal = problem(request, namespace)
            if refusal is not None:
                return refusal
            if int(request.headers.get("content-length") or 0) > CODEC_SERVER_MAX_BODY:
                return refused(request, 413, f"the body is over {CODEC_SERVER_MAX_BODY} bytes: send fewer payloads")
            try:
                payloads = ParseDict(json.loads(await request.body()), Payloads())
            except (ValueError, ParseError) as e:
                return refused(request, 400, f"expected JSON {{\"payloads\": [...]}} with payloads in protobuf's "
                                             f"JSON form: {e}")
            try:
                if direction == "encode":
                    result = await payload_codec.encode(list(payloads.payloads))
                else:
                    result = await payload_codec.decode(list(payloads.payloads))
            except CodeModeError as e:  # our codec's refusals name the key and what to do
                return refused(request, 400, str(e))
            body = MessageToDict(Payloads(payloads=result))
            return JSONResponse({"payloads": body.get("payloads", [])}, headers=cors(request))

        return handle

    routes = []
    for direction in ("encode", "decode"):
        handler = endpoint(direction)
        routes.append(Route(f"/{direction}", handler, methods=["POST", "OPTIONS"]))
        routes.append(Route(f"/{{namespace}}/{direction}", handler, methods=["POST", "OPTIONS"]))
    return Starlette(routes=routes)


async def serve_codec_server(app: Starlette, *, host: str = "127.0.0.1", port: int = DEFAULT_CODEC_PORT,
                             announce: Callable[[str], None] = print) -> None:
    """Serve `app` with uvicorn until cancelled; `announce` gets its address once it listens.

    Raises:
        CodeModeUserError: the port is taken.

    """
    try:
        with socket.socket() as sock:  # (uvicorn exits the process when it cannot bind: asked first)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            port = port or int(sock.getsockname()[1])
    except OSError as e:
        raise CodeModeUserError(f"the codec server cannot listen on {host}:{port}: {e.strerror or e} (another "
                                "program has the port? --port)") from e
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise CodeModeUserError(f"the codec server could not listen on {host}:{port} (--port)")
        await asyncio.sleep(0.02)
    announce(f"http://{host}:{port}")
    try:
        await asyncio.shield(task)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
