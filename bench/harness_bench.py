"""durable-codemode against pydantic-ai-harness's code mode on Temporal and the floor, in one run.

`python bench/harness_bench.py [--n 20 200] [--kinds gather sequential] [--reps 5] [--json rows.json]`
starts one dev server in memory and runs the same scripted task three ways on it: our runtime
(`run_bench.make_agent`), pydantic-ai-harness's `CodeMode` with `TemporalDurability` (`bench/harness_side.py`,
a subprocess in the harness's own Python), and the floor (`bench/floor.py`). Every scenario runs R times,
the three sides interleaved with the order flipped on each repetition, after a warm-up; it prints one table of
medians, with ratios against the floor of the same repetition. See `bench/README.md` ("Against
pydantic-ai-harness") for what each side does and how to install the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

from temporalio.worker import Worker

from bench.floor import FLOOR_ACTIVITIES, FloorWorkflow
from bench.run_bench import (
    CODEMODE_QUEUE,
    FLOOR_QUEUE,
    Bench,
    Kind,
    Row,
    fmt_s,
    machine,
    make_agent,
    run_and_exit,
    snippet,
)
from durable_codemode import create_worker, start_dev_server
from durable_codemode.worker._pool import shutdown_pool
from durable_codemode.worker._worker import workflow_runner

Side = Literal["codemode", "harness", "floor"]
SIDES: tuple[Side, ...] = ("codemode", "harness", "floor")
HARNESS_QUEUE = "bench-harness"
HARNESS_DEFAULT_MAX_TOOL_CALLS = 100
"""`CodeMode(max_tool_calls=...)`'s default: a `run_code` making more nested calls than this is refused."""
HARNESS_BUDGET_NOTE = "harness: max_tool_calls raised from its default 100 (and max_suspensions from 1,000)"
"""The row note where N goes past the harness's default budget: `bench/harness_workflow.py` raises it, or
the program would fail at its 101st call."""
ROOT = Path(__file__).resolve().parent.parent
HARNESS_SIDE = ROOT / "bench" / "harness_side.py"
HARNESS_VENV_PYTHON = ROOT / ".venv-harness" / "bin" / "python"
"""Where `bench/README.md` installs the harness: its own venv, because pydantic-ai-harness 0.62 pins
`pydantic-ai-slim==2.62.0` and durable-codemode needs `>=2.68`."""


def harness_python(explicit: str | None = None) -> str | None:
    """The interpreter that runs the harness side: `explicit`, `$HARNESS_PYTHON`, `.venv-harness`, or this one.

    Returns the first candidate that can import `pydantic_ai_harness` and Temporal's pydantic-ai integration,
    or `None` when none can (the smoke test then skips; the script exits with the install command).
    """
    candidates = [explicit] if explicit else [os.environ.get("HARNESS_PYTHON"), str(HARNESS_VENV_PYTHON),
                                              sys.executable]
    for python in candidates:
        if not python or not Path(python).exists():
            continue
        probe = subprocess.run([python, "-c", "import pydantic_ai_harness, pydantic_ai.durable_exec.temporal"],
                               capture_output=True, timeout=60, check=False)
        if probe.returncode == 0:
            return python
    return None


class HarnessSide:
    """The harness subprocess: one request line in, one result line out (see `bench/harness_side.py`)."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: IO[bytes], versions: dict[str, str]) -> None:
        self.proc = proc
        self.stderr = stderr
        self.versions = versions

    @classmethod
    async def start(cls, python: str, target: str, namespace: str, runner: str, *, verbose: bool) -> HarnessSide:
        # Its stderr goes to a file (or ours with -v), so a failure can show it without a pipe filling up; the
        # file lives as long as the side (closed in `close`), hence no `with`.
        stderr: IO[bytes] = sys.stderr.buffer if verbose else tempfile.TemporaryFile()  # noqa: SIM115
        proc = await asyncio.create_subprocess_exec(
            python, str(HARNESS_SIDE), "--target", target, "--namespace", namespace, "--task-queue", HARNESS_QUEUE,
            "--runner", runner, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr)
        side = cls(proc, stderr, {})
        ready = await side._read()
        side.versions = ready["versions"]
        return side

    async def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the harness side exited ({await self.proc.wait()}):\n{self._stderr_tail()}")
        message: dict[str, Any] = json.loads(line)
        return message

    def _stderr_tail(self) -> str:
        if self.stderr is sys.stderr.buffer:
            return "(its stderr is above)"
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-4000:]

    async def run(self, kind: Kind, n: int, rep: int) -> Row:
        """One harness run of the scenario and its replay, checked like the other sides'."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"code": snippet(kind, n), "n": n}) + "\n").encode())
        await self.proc.stdin.drain()
        r = await self._read()
        if "error" in r:
            raise RuntimeError(f"harness {kind}-{n} failed:\n{r['error']}")
        if r["output"] != str(sum(range(n))) or r["nested_calls"] != n:
            raise AssertionError(f"harness {kind}-{n}: output {r['output']!r} (want {sum(range(n))!r}), "
                                 f"{r['nested_calls']} nested calls (want {n})")
        return Row(scenario=f"{kind}-{n}", kind=kind, n=n, side="harness", rep=rep, wall_s=r["wall_s"],
                   events=r["events"], history_proto_bytes=r["history_proto_bytes"],
                   history_json_chars=r["history_json_chars"], replay_s=r["replay_s"])

    async def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self.stderr is not sys.stderr.buffer:
            self.stderr.close()


def ratio(rows: Sequence[Row], scenario: str, top: Side, bottom: Side, attr: str) -> float:
    """Median over repetitions of `top` / `bottom` (`attr`: wall or replay time), each pair from one repetition."""
    values = {(r.rep, r.side): float(getattr(r, attr)) for r in rows if r.scenario == scenario}
    reps = sorted({rep for rep, _ in values})
    return statistics.median(values[(rep, top)] / values[(rep, bottom)] for rep in reps)


def med(rows: Sequence[Row], side: Side, scenario: str, attr: str) -> float:
    return statistics.median(float(getattr(r, attr)) for r in rows if r.side == side and r.scenario == scenario)


def table(rows: Sequence[Row], scenarios: Sequence[tuple[Kind, int]], reps: int, notes: dict[str, str],
          runner: str) -> str:
    """The one table: per scenario, wall and replay per side, and ratios against the floor.

    A side with no rows for a scenario (the harness failed it, see `notes`) shows `—` in its cells.
    """
    header = ["scenario", "wall cm", "wall harness", "wall floor", "cm/floor", "harness/floor", "harness/cm",
              "replay cm", "replay harness", "replay floor", "replay cm/floor", "replay harness/floor",
              "history kB cm / harness / floor", "note"]
    pairs: tuple[tuple[Side, Side], ...] = (("codemode", "floor"), ("harness", "floor"), ("harness", "codemode"))
    lines: list[list[str]] = []
    for kind, n in scenarios:
        sc = f"{kind}-{n}"
        have = {s for s in SIDES if any(r.side == s and r.scenario == sc for r in rows)}

        def seconds(side: Side, attr: str, sc: str = sc, have: set[Side] = have) -> str:
            return fmt_s(med(rows, side, sc, attr)) if side in have else "—"

        def times(top: Side, bottom: Side, attr: str, sc: str = sc, have: set[Side] = have) -> str:
            return f"{ratio(rows, sc, top, bottom, attr):.2f}x" if {top, bottom} <= have else "—"

        kb = " / ".join(f"{med(rows, s, sc, 'history_proto_bytes') / 1024:,.0f}" if s in have else "—"
                        for s in SIDES)
        lines.append([
            sc, *(seconds(s, "wall_s") for s in SIDES), *(times(a, b, "wall_s") for a, b in pairs),
            *(seconds(s, "replay_s") for s in SIDES), times("codemode", "floor", "replay_s"),
            times("harness", "floor", "replay_s"), kb, notes.get(sc, "—"),
        ])
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [render(header), "-+-".join("-" * w for w in widths), *(render(line) for line in lines)]
    out.append(f"medians of {reps} repetition(s); cm = durable-codemode (unsandboxed runner); harness = "
               f"pydantic-ai-harness CodeMode + TemporalDurability ({runner} runner, its own process); floor = "
               "the bare workflow (unsandboxed runner); ratios = median of the per-repetition ratios; "
               "history kB = serialized protobuf (fetch_history)")
    return "\n".join(out)


async def run(args: argparse.Namespace, python: str) -> int:
    def log(text: str) -> None:
        if args.verbose:
            print(text, file=sys.stderr, flush=True)

    ns: list[int] = sorted(set(args.n))
    kinds: list[Kind] = list(dict.fromkeys(args.kinds))
    scenarios = [(k, n) for k in kinds for n in ns]
    agents = [make_agent(k, n) for k, n in scenarios]
    env = await start_dev_server(banner="stderr" if args.verbose else "off")
    harness: HarnessSide | None = None
    rows: list[Row] = []
    failed: dict[str, str] = {}
    try:
        client = env.client
        harness = await HarnessSide.start(python, client.service_client.config.target_host, client.namespace,
                                          args.harness_runner, verbose=args.verbose)
        v = harness.versions
        print(machine() + f"\nharness side: {python}, pydantic-ai-harness {v['pydantic-ai-harness']}, "
              f"pydantic-ai-slim {v['pydantic-ai-slim']}, temporalio {v['temporalio']}, pydantic-monty "
              f"{v['pydantic-monty']}, {args.harness_runner} workflow runner", flush=True)
        cm_worker = create_worker(client, agents, task_queue=CODEMODE_QUEUE)
        floor_worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow],
                              activities=FLOOR_ACTIVITIES, workflow_runner=workflow_runner())
        async with cm_worker, floor_worker:
            bench = Bench(client)

            async def measure(side: Side, kind: Kind, n: int, rep: int) -> Row:
                assert harness is not None
                return await (harness.run(kind, n, rep) if side == "harness" else bench.measure(side, kind, n, rep))

            # Warm-up: one unmeasured run of each kind at the smallest N on every side (imports, sandbox pools,
            # pollers, the replayers, the harness's first sandboxed workflow load).
            for kind in kinds:
                for side in SIDES:
                    row = await measure(side, kind, ns[0], -1)
                    log(f"warm-up {row.scenario} {side}: {row.wall_s:.3f} s")
            for rep in range(args.reps):
                for kind, n in scenarios:
                    for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
                        sc = f"{kind}-{n}"
                        if side == "harness" and sc in failed:
                            continue
                        try:
                            row = await measure(side, kind, n, rep)
                        except (RuntimeError, AssertionError) as e:
                            if side != "harness":
                                raise
                            # A scenario the harness cannot run is a row note, never a silent gap; its other
                            # repetitions skip it.
                            failed[sc] = f"harness failed: {str(e).strip().splitlines()[-1][:120]}"
                            log(f"rep {rep} {sc} harness: {e}")
                            continue
                        rows.append(row)
                        log(f"rep {rep} {row.scenario} {side}: wall {row.wall_s:.3f} s, replay "
                            f"{row.replay_s:.3f} s, {row.events} events, {row.history_proto_bytes} B")
    finally:
        if harness is not None:
            await harness.close()
        await env.shutdown()
        shutdown_pool()
    notes = {f"{k}-{n}": HARNESS_BUDGET_NOTE for k, n in scenarios if n > HARNESS_DEFAULT_MAX_TOOL_CALLS}
    notes.update(failed)
    print(table(rows, scenarios, args.reps, notes, args.harness_runner), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "n": ns, "kinds": kinds, "reps": args.reps, "harness_python": python,
            "harness_runner": args.harness_runner, "rows": [asdict(r) for r in rows],
        }, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, nargs="+", default=[20, 200], help="nested calls per scenario")
    parser.add_argument("--kinds", nargs="+", choices=["gather", "sequential"], default=["gather", "sequential"],
                        help="which programs to run (default: both)")
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions per scenario (median)")
    parser.add_argument("--json", metavar="FILE", help="write the raw rows (every repetition) as JSON")
    parser.add_argument("--harness-python", metavar="PATH",
                        help="the interpreter with pydantic-ai-harness[codemode,temporal] (default: "
                        "$HARNESS_PYTHON, then .venv-harness/bin/python, then this one)")
    parser.add_argument("--harness-runner", choices=["sandboxed", "unsandboxed"], default="sandboxed",
                        help="the harness's workflow runner, worker and replayer (default: Temporal's sandbox, "
                        "as its docs set it up)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every run to stderr")
    args = parser.parse_args(argv)
    if args.reps < 1 or min(args.n) < 1:
        parser.error("--reps and --n must be at least 1")
    python = harness_python(args.harness_python)
    if python is None:
        parser.error("no interpreter here can import pydantic_ai_harness: it pins pydantic-ai-slim==2.62.0, so "
                     "install it in its own venv: python3 -m venv .venv-harness && .venv-harness/bin/pip install "
                     "'pydantic-ai-harness[codemode,temporal]>=0.62' (or pass --harness-python)")
    run_and_exit(run(args, python))


if __name__ == "__main__":
    main()
