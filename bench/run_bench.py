"""Code mode on Temporal against the floor: a bare workflow making the same activity calls.

`python bench/run_bench.py [--n 20 100 200] [--reps 5] [--json rows.json] [--check]` starts a dev server in
memory, a code-mode worker and a floor worker, runs every scenario R times (code mode and floor interleaved,
the order alternating per repetition) after a warm-up, and prints one table of medians. The `batched-N` rows
gather N calls of a `ToolOptions(batch=True)` tool (one batch activity) against the same per-call floor as
`gather-N` (`--no-batched` leaves them out). See `bench/README.md` for what is measured and how.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.floor` must be importable

from pydantic_ai import Agent
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, Worker

from bench.floor import FLOOR_ACTIVITIES, FloorInput, FloorWorkflow
from durable_codemode import (
    CodeModeAgent,
    CodeModeRunWorkflow,
    ToolOptions,
    create_worker,
    start_dev_server,
    start_run,
)
from durable_codemode._converter import DATA_CONVERTER as pydantic_data_converter
from durable_codemode.testing import RunCode, last_result, scripted_model
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner

Kind = Literal["gather", "sequential", "batched"]
"""`batched`: the gather of `gather`, to a tool with `ToolOptions(batch=True)` (one batch activity), against the
same per-call floor (the bare workflow's gather of N activities)."""
Side = Literal["codemode", "floor", "sandboxed"]
"""`floor` runs the bare workflow with the runtime's own (unsandboxed) workflow runner, in the worker and the
replayer: the fair floor. `sandboxed` (opt-in, `--sandboxed-floor`) is the same workflow in Temporal's default
sandboxed runner, which costs more and so flatters any ratio taken against it."""

CODEMODE_QUEUE = "bench-codemode"
FLOOR_QUEUE = "bench-floor"
SANDBOXED_FLOOR_QUEUE = "bench-floor-sandboxed"

#: Goals of issue 16, ratios of medians (code mode / unsandboxed floor) in one run; wall by scenario.
TARGET_WALL_RATIO: dict[str, float] = {"gather-200": 1.05, "sequential-200": 1.10, "gather-20": 1.20,
                                       "batched-200": 0.3}
TARGET_REPLAY_RATIO = 1.3  # replay of either N=200 history, code mode / floor
TARGET_OVERHEAD = 300.0  # history bytes per nested call beyond the tool's own arguments and result
TARGET_N = 200


def snippet(kind: Kind, n: int) -> str:
    """The `run_code` program of a scenario."""
    if kind in ("gather", "batched"):
        return f"import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range({n})))\nsum(r)"
    return f"total = 0\nfor i in range({n}):\n    total += await get(i=i)\ntotal"


def make_agent(kind: Kind, n: int) -> CodeModeAgent:
    """An agent whose scripted model makes one `run_code` call, then answers with the snippet's result."""
    model = scripted_model(RunCode(snippet(kind, n)), lambda m: str(last_result(m)["result"]))
    agent = Agent(model, name=f"bench-{kind}-{n}", instructions="Use run_code.")

    @agent.tool_plain
    async def get(i: int) -> int:
        """Get the value of item i."""
        return i

    return CodeModeAgent(agent, tool_options={"get": ToolOptions(batch=True)} if kind == "batched" else None)


@dataclass
class Row:
    """One measured run (`--json` writes these)."""

    scenario: str
    kind: str
    n: int
    side: str
    rep: int
    wall_s: float
    events: int
    history_proto_bytes: int
    history_json_chars: int
    replay_s: float


def history_sizes(history: WorkflowHistory) -> tuple[int, int, int]:
    """Events, serialized protobuf bytes (what the server stores), `to_json()` characters."""
    return len(history.events), History(events=list(history.events)).ByteSize(), len(history.to_json())


class Bench:
    """Runs scenarios against one client; both workers must be running."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.cm_replayer = Replayer(workflows=[CodeModeRunWorkflow], data_converter=pydantic_data_converter,
                                    workflow_runner=workflow_runner())
        self.floor_replayer = Replayer(workflows=[FloorWorkflow], data_converter=pydantic_data_converter,
                                       workflow_runner=workflow_runner())
        self.sandboxed_replayer = Replayer(workflows=[FloorWorkflow], data_converter=pydantic_data_converter)

    async def run_codemode(self, kind: Kind, n: int) -> tuple[float, WorkflowHistory]:
        start = time.perf_counter()
        handle = await start_run(self.client, f"bench-{kind}-{n}", "go", task_queue=CODEMODE_QUEUE,
                                 run_id=f"bench-cm-{kind}-{n}-{uuid.uuid4().hex[:8]}")
        result = await handle.result()
        wall = time.perf_counter() - start
        expected = str(sum(range(n)))
        if result.output != expected or len(result.nested_calls) != n:
            raise AssertionError(f"code mode {kind}-{n}: output {result.output!r} (want {expected!r}), "
                                 f"{len(result.nested_calls)} nested calls (want {n})")
        return wall, await handle.fetch_history()

    async def run_floor(self, kind: Kind, n: int, *, sandboxed: bool = False) -> tuple[float, WorkflowHistory]:
        start = time.perf_counter()
        mode: Literal["gather", "sequential"] = "sequential" if kind == "sequential" else "gather"
        handle = await self.client.start_workflow(FloorWorkflow.run, FloorInput(n=n, mode=mode),
                                                  id=f"bench-floor-{kind}-{n}-{uuid.uuid4().hex[:8]}",
                                                  task_queue=SANDBOXED_FLOOR_QUEUE if sandboxed else FLOOR_QUEUE)
        result = await handle.result()
        wall = time.perf_counter() - start
        if result != sum(range(n)):
            raise AssertionError(f"floor {kind}-{n}: got {result}, want {sum(range(n))}")
        return wall, await handle.fetch_history()

    async def measure(self, side: Side, kind: Kind, n: int, rep: int) -> Row:
        if side == "codemode":
            replayer = self.cm_replayer
            wall, history = await self.run_codemode(kind, n)
        else:
            replayer = self.sandboxed_replayer if side == "sandboxed" else self.floor_replayer
            wall, history = await self.run_floor(kind, n, sandboxed=side == "sandboxed")
        start = time.perf_counter()
        await replayer.replay_workflow(history)
        replay = time.perf_counter() - start
        events, proto, js = history_sizes(history)
        return Row(scenario=f"{kind}-{n}", kind=kind, n=n, side=side, rep=rep, wall_s=wall, events=events,
                   history_proto_bytes=proto, history_json_chars=js, replay_s=replay)


def median(rows: Sequence[Row], side: Side, scenario: str, attr: str) -> float:
    values = [float(getattr(r, attr)) for r in rows if r.side == side and r.scenario == scenario]
    return statistics.median(values)


def paired_ratio(rows: Sequence[Row], scenario: str, attr: str = "wall_s", floor: Side = "floor") -> float:
    """Median over repetitions of code mode / floor (`attr`: wall or replay time), each pair run back to back."""
    values: dict[tuple[int, str], float] = {(r.rep, r.side): getattr(r, attr) for r in rows if r.scenario == scenario}
    reps = sorted({rep for rep, _ in values})
    return statistics.median(values[(rep, "codemode")] / values[(rep, floor)] for rep in reps)


def machine() -> str:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    from durable_codemode.client._devserver import temporal_cli_path

    try:
        cli = subprocess.run([temporal_cli_path(), "--version"], capture_output=True, text=True, timeout=10,
                             check=False).stdout.strip()
    except Exception as e:  # the version line is informative only
        cli = f"? ({e})"
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"machine: {platform.machine()} {platform.system()} {platform.release()}, cpu_count={os.cpu_count()} "
        f"(usable {affinity}), {platform.processor() or ''}".rstrip(", ") + "\n"
        f"python {platform.python_version()}, temporalio {version('temporalio')}, pydantic-monty "
        f"{version('pydantic-monty')}, pydantic-ai-slim {version('pydantic-ai-slim')}, {cli}"
    )


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def table(rows: Sequence[Row], scenarios: Sequence[tuple[Kind, int]], reps: int) -> tuple[str, list[bool]]:
    """The one table, and the target verdicts."""
    sandboxed = any(r.side == "sandboxed" for r in rows)
    header = ["scenario", "wall cm", "wall floor", "cm/floor", *(["cm/sandboxed"] if sandboxed else []),
              "events cm/floor", "history B cm/floor", "overhead B/call", "marginal B/call", "replay cm",
              "replay floor", "replay cm/floor", "targets"]
    lines: list[list[str]] = []
    verdicts: list[bool] = []
    smallest: dict[str, int] = {}
    for kind, n in scenarios:
        smallest.setdefault(kind, n)
    for kind, n in scenarios:
        sc = f"{kind}-{n}"

        def m(side: Side, attr: str, sc: str = sc) -> float:
            return median(rows, side, sc, attr)

        wall_cm, wall_fl = m("codemode", "wall_s"), m("floor", "wall_s")
        ratio = paired_ratio(rows, sc)
        replay_ratio = paired_ratio(rows, sc, "replay_s")
        b_cm, b_fl = m("codemode", "history_proto_bytes"), m("floor", "history_proto_bytes")
        overhead = (b_cm - b_fl) / n
        marginal = "—"
        n0 = smallest[kind]
        if n0 != n:
            sc0 = f"{kind}-{n0}"
            d0 = median(rows, "codemode", sc0, "history_proto_bytes") - median(rows, "floor", sc0,
                                                                                 "history_proto_bytes")
            marginal = f"{((b_cm - b_fl) - d0) / (n - n0):.0f}"
        targets: list[str] = []
        goal = TARGET_WALL_RATIO.get(sc)
        if goal is not None:
            ok = ratio <= goal
            verdicts.append(ok)
            targets.append(f"wall≤{goal}x {verdict(ok)}")
        if n == TARGET_N:
            ok = replay_ratio <= TARGET_REPLAY_RATIO
            verdicts.append(ok)
            targets.append(f"replay≤{TARGET_REPLAY_RATIO}x {verdict(ok)}")
            ok = overhead <= TARGET_OVERHEAD
            verdicts.append(ok)
            targets.append(f"overhead≤{TARGET_OVERHEAD:.0f} B {verdict(ok)}")
        lines.append([
            sc, fmt_s(wall_cm), fmt_s(wall_fl), f"{ratio:.2f}x",
            *([f"{paired_ratio(rows, sc, floor='sandboxed'):.2f}x"] if sandboxed else []),
            f"{m('codemode', 'events'):.0f} / {m('floor', 'events'):.0f}",
            f"{b_cm:,.0f} / {b_fl:,.0f}", f"{overhead:.0f}", marginal,
            fmt_s(m("codemode", "replay_s")), fmt_s(m("floor", "replay_s")), f"{replay_ratio:.2f}x",
            ", ".join(targets) or "—",
        ])
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [render(header), "-+-".join("-" * w for w in widths)]
    out += [render(line) for line in lines]
    if verdicts:
        failed = len(verdicts) - sum(verdicts)
        out.append(f"targets: {sum(verdicts)}/{len(verdicts)} PASS" + (f", {failed} FAIL" if failed else ""))
    else:
        out.append(f"targets: not evaluated (they apply to N={TARGET_N} and gather-20)")
    out.append(f"medians of {reps} repetition(s); floor = the bare workflow with the runtime's own unsandboxed "
               "workflow runner (worker and replayer)" + ("; sandboxed = the same in Temporal's default sandbox"
                                                          if sandboxed else "") + "; "
               "cm/floor = median of the per-repetition ratios; history B = "
               "serialized protobuf bytes (fetch_history); overhead = (B cm - B floor) / N; marginal = the same "
               "per extra call beyond the smallest N")
    return "\n".join(out), verdicts


async def run(args: argparse.Namespace) -> int:
    def log(text: str) -> None:
        if args.verbose:
            print(text, file=sys.stderr, flush=True)

    ns: list[int] = sorted(set(args.n))
    kinds: list[Kind] = ["gather", "sequential"]
    if args.batched:
        kinds.append("batched")
    scenarios = [(k, n) for k in kinds for n in ns]
    machine_text = machine()
    print(machine_text, flush=True)
    if args.dynamic_config:
        print(f"dev server dynamic config: {', '.join(args.dynamic_config)}", flush=True)
    agents = [make_agent(k, n) for k, n in scenarios]
    # stdout carries only the machine line and the table: the dev server's banner goes to stderr, or nowhere.
    env = await start_dev_server(extra_args=[a for kv in args.dynamic_config for a in ("--dynamic-config-value", kv)],
                                 banner="stderr" if args.verbose else "off")
    try:
        client = env.client
        cm_worker = create_worker(client, agents, task_queue=CODEMODE_QUEUE)
        floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow],
                              activities=FLOOR_ACTIVITIES, workflow_runner=workflow_runner())
        sandboxed_worker = Worker(client, task_queue=SANDBOXED_FLOOR_QUEUE, workflows=[FloorWorkflow],
                                  activities=FLOOR_ACTIVITIES)
        async with cm_worker, floor_worker, sandboxed_worker:
            bench = Bench(client)
            # Warm-up: one unmeasured run of each kind at the smallest N on both sides (imports, the sandbox
            # pool, pollers, the replayers).
            floors: list[Side] = ["floor", "sandboxed"] if args.sandboxed_floor else ["floor"]
            warm_sides: list[Side] = ["codemode", *floors]
            for kind in kinds:
                for side in warm_sides:
                    row = await bench.measure(side, kind, ns[0], -1)
                    log(f"warm-up {row.scenario} {side}: {row.wall_s:.3f} s")
            rows: list[Row] = []
            for rep in range(args.reps):
                for kind, n in scenarios:
                    sides: list[Side] = ["codemode", *floors] if rep % 2 == 0 else [*floors, "codemode"]
                    for side in sides:
                        row = await bench.measure(side, kind, n, rep)
                        rows.append(row)
                        log(f"rep {rep} {row.scenario} {side}: wall {row.wall_s:.3f} s, replay "
                            f"{row.replay_s:.3f} s, {row.events} events, {row.history_proto_bytes} B")
    finally:
        await env.shutdown()
        shutdown_pool()
    text, verdicts = table(rows, scenarios, args.reps)
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine_text, "n": ns, "reps": args.reps, "dynamic_config": args.dynamic_config,
            "rows": [asdict(r) for r in rows],
        }, indent=1))
    return 1 if args.check and not all(verdicts) else 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, nargs="+", default=[20, 100, 200], help="nested calls per scenario")
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions per scenario (median)")
    parser.add_argument("--json", metavar="FILE", help="write the raw rows (every repetition) as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--dynamic-config", metavar="KEY=VALUE", action="append", default=[],
                        help="a dev-server dynamic config value, e.g. "
                        "history.transferProcessorMaxPollRPS=1000 (repeatable; default: none)")
    parser.add_argument("--sandboxed-floor", action="store_true",
                        help="also run the floor in Temporal's default sandboxed runner (a cm/sandboxed column)")
    parser.add_argument("--no-batched", dest="batched", action="store_false",
                        help="leave out the batched-N rows (a gather of a ToolOptions(batch=True) tool)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every run to stderr")
    args = parser.parse_args(argv)
    if args.reps < 1 or min(args.n) < 1:
        parser.error("--reps and --n must be at least 1")
    run_and_exit(run(args))


def run_and_exit(main_coroutine: Coroutine[Any, Any, int]) -> NoReturn:
    """Run a benchmark's main coroutine, then leave with its exit code (1 on any error, with its traceback)."""
    try:
        code = asyncio.run(main_coroutine)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # A script ending in Temporal calls can abort at interpreter exit (PyGILState_Release): leave at once.
    os._exit(code)


if __name__ == "__main__":
    main()
