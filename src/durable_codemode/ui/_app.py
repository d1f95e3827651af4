"""The web page to watch runs and decide their waiting calls: `codemode ui`, and `ui_app` for your own server.

A Starlette app with two pages (the runs, and one run) served as static files with no build step and nothing from
the network, and a JSON API the pages call:

- `GET /api/runs?agent=&status=`: the newest runs (`list_runs`), with how many calls each waits on;
- `GET /api/runs/{run}/events?after=N`: the run's next events after offset `N` (a long poll: it answers as soon as
  there are some, or after `_WAIT` with none), drawn live by the run page; a run that does not stream says so;
- `GET /api/runs/{run}/pending`: the calls waiting for a person, with their arguments whole;
- `GET /api/runs/{run}/trace`: the run as `codemode trace` draws it, from its history;
- `POST /api/runs/{run}/decisions` `{"call_id", "approved", "note"}`: decide a waiting call.

Who may do what:
- Every API request carries the session token printed at start (`Authorization: Bearer`), as Jupyter's do; the
  pages keep it in the tab's session storage, and take it out of the address bar.
- A decision is made as the one approver the server was started as: signed with their key file (`--key`, as
  `codemode approve --key` signs), or unsigned under a name (`--approver`, for workers that take unsigned
  decisions: the dev server). Started with neither, the page is read-only.
- A decision is a POST of JSON with the token in a header, from the page's own origin (`Origin` checked): a form or
  a script on another site can send neither, and the API answers no CORS preflight.
- Requests for another host than the one served are refused (DNS rebinding); `codemode ui` binds loopback only
  unless told otherwise (`--allow-remote`).
- Every page and answer carries a content security policy that allows only the page's own script and styles.
All run content is untrusted: the answers escape it (`_views`) and the pages insert it as text, never as HTML.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowUpdateFailedError

from ..client._deciding import decide, pending_approvals
from ..client._listing import RUN_STATES, list_runs
from ..client._signer import ApprovalSigner
from ..client._stream import RunEventItem, stream_events, streams
from ..history._read import trace_run
from ..history._trace import render_trace
from ..shared._errors import (
    CodeModeUserError,
    DecisionConflictError,
    RunClosedError,
    RunNotFoundError,
    WorkerUnavailableError,
)
from ..shared._names import STREAM_INFO_QUERY
from ..shared._results import printable
from ..workflow._event_stream import StreamInfo
from ._views import event_view, pending_view, run_view

__all__ = ["UIAccess", "ui_app"]

_WAIT = 10.0
"""How long an events request waits for the run's next event before it answers with none."""
_SETTLE = 0.05
"""Once an events request has some, how long it waits for more that come right after (one answer, not many)."""
_MAX_EVENTS = 500
_MAX_NOTE = 500
_STATIC = ("index.html", "run.html", "app.js", "app.css")

_SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class UIAccess:
    """Who the page decides as: an approver's key (`signer`), a name for unsigned decisions, or nobody."""

    signer: ApprovalSigner | None = None
    approver: str | None = None
    """Decide unsigned, as this person (for workers that take unsigned decisions); ignored with `signer`."""

    @property
    def name(self) -> str | None:
        return self.signer.approver if self.signer is not None else self.approver

    @property
    def can_decide(self) -> bool:
        return self.name is not None


def _static(name: str) -> bytes:
    return resources.files("durable_codemode.ui").joinpath("static", name).read_bytes()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": printable(message)}, status_code=status, headers=_SECURITY_HEADERS)


def ui_app(client: Client, *, token: str, access: UIAccess | None = None, hosts: tuple[str, ...] = (),
           list_limit: int = 50) -> Starlette:
    """The web app over `client`'s runs, for the session token `token`.

    Args:
        client: from `durable_codemode.connect()`.
        token: what every API request must carry (`Authorization: Bearer TOKEN`); print it with the URL.
        access: who decisions are made as (`UIAccess`); `None`: read-only.
        hosts: the `host` or `host:port` names the app answers to (requests naming another host are refused);
            empty: any (behind your own server, which checks it).
        list_limit: runs on the runs page, at most.

    """
    if len(token) < 16:
        raise CodeModeUserError("the UI's session token must be at least 16 characters (secrets.token_urlsafe())")
    access = access or UIAccess()
    pages: dict[str, bytes] = {name: _static(name) for name in _STATIC}

    def checked(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if hosts and request.headers.get("host", "") not in hosts:
                return _error(421, f"this server answers for {', '.join(hosts)} only")
            if not request.url.path.startswith("/api/"):
                return await handler(request)
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not given or not hmac.compare_digest(given.encode(), token.encode()):
                return _error(401, "missing or wrong session token: open the page from the address `codemode ui` "
                                   "printed (it carries the token), or reload it from there")
            if request.method == "POST":
                origin = request.headers.get("origin")
                own = f"{request.url.scheme}://{request.headers.get('host', '')}"
                if origin is not None and origin != own:
                    return _error(403, f"a decision must come from this page ({own}), not from {origin}")
                if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                    return _error(415, "a decision is sent as application/json")
            try:
                return await handler(request)
            except RunNotFoundError as e:
                return _error(404, str(e))
            except RunClosedError as e:
                return _error(409, f"{e}; nothing was decided")
            except DecisionConflictError as e:
                return _error(409, str(e))
            except WorkflowUpdateFailedError as e:
                cause = getattr(e.cause, "message", None) or str(e.cause or e)
                return _error(409, f"the run refused the decision: {cause}")
            except WorkerUnavailableError as e:
                return _error(503, str(e))
            except CodeModeUserError as e:
                return _error(400, str(e))

        return guarded

    def page(name: str, media: str) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            return Response(pages[name], media_type=media, headers=_SECURITY_HEADERS)

        return serve

    async def nothing(request: Request) -> Response:
        return Response(status_code=204, headers=_SECURITY_HEADERS)

    async def me(request: Request) -> Response:
        return JSONResponse({"approver": printable(access.name) if access.name else None,
                             "signed": access.signer is not None, "states": list(RUN_STATES)},
                            headers=_SECURITY_HEADERS)

    async def runs(request: Request) -> Response:
        agent = request.query_params.get("agent") or None
        status = request.query_params.get("status") or None
        listed = await list_runs(client, agent=agent, status=status, limit=list_limit)
        views = [run_view(r) for r in listed]
        running = [v for v in views if v["state"] in ("running", "waiting for approval")]
        for view, calls in zip(running, await asyncio.gather(*(_calls(client, v["raw_id"]) for v in running)),
                               strict=True):
            view["calls"] = calls
        return JSONResponse({"runs": views}, headers=_SECURITY_HEADERS)

    async def events(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        after = _offset(request.query_params.get("after"))
        if not await streams(client, run_id):
            return JSONResponse({"streams": False, "events": []}, headers=_SECURITY_HEADERS)
        items = await _next_events(client, run_id, after)
        views = [v for v in (event_view(i) for i in items) if v is not None]
        last = items[-1].offset if items else after
        return JSONResponse({"streams": True, "events": views, "last": last}, headers=_SECURITY_HEADERS)

    async def pending(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        waiting = await pending_approvals(client, run_id)
        return JSONResponse({"pending": [pending_view(p) for p in waiting]}, headers=_SECURITY_HEADERS)

    async def trace(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        drawn = render_trace(await trace_run(client, run_id), width=120)
        return JSONResponse({"trace": printable(drawn, lines=True)}, headers=_SECURITY_HEADERS)

    async def decisions(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if not access.can_decide:
            return _error(403, "this page is read-only: start it as an approver to decide (`codemode ui --key "
                               "FILE`, or `--approver NAME` where workers take unsigned decisions)")
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "the decision is not JSON")
        call_id, approved, note = (body.get("call_id"), body.get("approved"), body.get("note")) if isinstance(
            body, dict) else (None, None, None)
        if not isinstance(call_id, str) or not call_id or len(call_id) > 200:
            return _error(400, "call_id: the id of the waiting call, a string")
        if not isinstance(approved, bool):
            return _error(400, "approved: true or false")
        if note is not None and (not isinstance(note, str) or len(note) > _MAX_NOTE):
            return _error(400, f"note: a string of at most {_MAX_NOTE} characters")
        record = await decide(client, run_id, call_id, approved=approved, note=note or None,
                              approver=access.name, signer=access.signer)
        return JSONResponse({"decided": printable(record.call_id), "approved": record.approved,
                             "settled": record.settled, "approver": printable(record.approver or "")},
                            headers=_SECURITY_HEADERS)

    def route(path: str, handler: Callable[[Request], Awaitable[Response]], methods: list[str] | None = None) -> Route:
        return Route(path, checked(handler), methods=methods)

    routes = [
        route("/", page("index.html", "text/html; charset=utf-8")),
        route("/run/{run_id:path}", page("run.html", "text/html; charset=utf-8")),
        route("/static/app.js", page("app.js", "text/javascript; charset=utf-8")),
        route("/static/app.css", page("app.css", "text/css; charset=utf-8")),
        route("/favicon.ico", nothing),
        route("/api/me", me),
        route("/api/runs", runs),
        route("/api/runs/{run_id:path}/events", events),
        route("/api/runs/{run_id:path}/pending", pending),
        route("/api/runs/{run_id:path}/trace", trace),
        route("/api/runs/{run_id:path}/decisions", decisions, methods=["POST"]),
    ]
    return Starlette(routes=routes)


async def _calls(client: Client, run_id: str) -> int | None:
    """Tool calls a running run has made so far (`None`: no worker answered in a second, or an older one)."""
    try:
        info: StreamInfo = await client.get_workflow_handle(run_id).query(
            STREAM_INFO_QUERY, result_type=StreamInfo, rpc_timeout=timedelta(seconds=1))
    except Exception:  # no worker, an old worker, a missed deadline: unknown, never fatal to the page
        return None
    return info.calls


def _offset(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError as e:
        raise CodeModeUserError(f"after: an offset (an integer), got {text[:40]!r}") from e
    if value < -1:
        raise CodeModeUserError(f"after: an offset of -1 or more, got {value}")
    return value


async def _next_events(client: Client, run_id: str, after: int | None) -> list[RunEventItem]:
    """The run's events after `after`: as soon as some come (and those right behind them), or none after `_WAIT`."""
    items: list[RunEventItem] = []
    reader = stream_events(client, run_id, after=after)
    deadline = time.monotonic() + _WAIT
    try:
        while len(items) < _MAX_EVENTS:
            left = _SETTLE if items else deadline - time.monotonic()
            if left <= 0:
                break
            try:
                items.append(await asyncio.wait_for(anext(reader), left))
            except (TimeoutError, StopAsyncIteration):
                break
    finally:
        with contextlib.suppress(Exception):
            await reader.aclose()
    return items
