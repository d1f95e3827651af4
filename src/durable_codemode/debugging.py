"""Debugging from histories: export a run's history, draw it as a trace, replay it offline, list recent runs.

The Python side of `codemode history / trace / replay / runs`:

```python
from durable_codemode import connect
from durable_codemode.debugging import fetch_chain, render_replay, render_trace, replay_histories, trace_histories

client = await connect()
histories = await fetch_chain(client, "cart-1a2b3c")   # every run of the continue-as-new chain
print(render_trace(await trace_histories(histories)))  # turns → snippets → calls → approvals
report = await replay_histories(histories)             # offline: no server, no activity runs
if not report.ok:
    print(render_replay(report))                       # turn, snippet, line, call, recorded vs replayed, cause
```

Replays of runs recorded by behaviour version 1 need the agents' approval rules (code that decides whether a call
waits; later runs record each verdict): call `register_agents([...])` (or `load_agents("my_worker_module")`) first.

Before a deploy, `check_deploy(client, import_agents("new_worker_module"))` compares every open run's recorded agent
with the new code (`codemode check-deploy`), and `move_run` pins a run to another Worker Deployment version
(`codemode move`, which checks first).
"""

from __future__ import annotations

from ._history_fetch import (
    fetch_chain,
    fetch_history,
    histories_from_json,
    histories_to_json,
)
from .client._deploys import move_run
from .client._listing import RunSummary, list_runs
from .history._capture import ReplayCapture, replay_history
from .history._deploy_check import (
    DeployCheck,
    Finding,
    RunCheck,
    check_deploy,
    render_deploy_check,
)
from .history._divergence import CallSide, Cause, Divergence
from .history._read import trace_histories, trace_run
from .history._replay import (
    ReplayReport,
    RunReplay,
    import_agents,
    load_agents,
    register_agents,
    render_replay,
    replay_histories,
    replay_recent,
    replay_run,
)
from .history._trace import (
    CallStatus,
    RunTrace,
    TraceApproval,
    TraceCall,
    TraceRun,
    TraceSnippet,
    TraceTurn,
    render_trace,
)

__all__ = [
    "CallSide",
    "CallStatus",
    "Cause",
    "DeployCheck",
    "Divergence",
    "Finding",
    "ReplayCapture",
    "ReplayReport",
    "RunCheck",
    "RunReplay",
    "RunSummary",
    "RunTrace",
    "TraceApproval",
    "TraceCall",
    "TraceRun",
    "TraceSnippet",
    "TraceTurn",
    "check_deploy",
    "fetch_chain",
    "fetch_history",
    "histories_from_json",
    "histories_to_json",
    "import_agents",
    "list_runs",
    "load_agents",
    "move_run",
    "register_agents",
    "render_deploy_check",
    "render_replay",
    "render_trace",
    "replay_histories",
    "replay_history",
    "replay_recent",
    "replay_run",
    "trace_histories",
    "trace_run",
]
