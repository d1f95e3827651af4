"""What a snippet's fresh sandbox session costs the workflow thread, cold and warmed: one table.

`python bench/snippet_costs.py [--reps 9]` checks out sessions of one Monty pool as a run's snippets do (the same
stubs prelude, the bench agent's tool stub, type checking on) and times, per program, median of R:

- **first check, cold**: `feed_start` of the program in a fresh session, to its first tool call: almost all of
  it is the type checker loading the builtins' stubs, which every fresh session pays once;
- **warm-up**: `_pool.WARM_UP_PROGRAM` fed to a fresh session (the checker rejects it, nothing runs), which the
  pool does off the workflow thread while the run's model request is in flight
  (`_pool.SandboxPool.prewarm_session`);
- **first check, warmed**: the same program's `feed_start` after the warm-up;
- **end, checked / loaded**: `__exit__` of a session that type-checked, and of one that only loaded a dump (a
  program resumed after a wait). A run gives sessions back off the workflow thread (`_pool.SandboxPool.session`).

The ratio column is warmed / cold: what of the first check's cost a warmed session leaves on the workflow thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.*` must be importable

import pydantic_monty
from pydantic_monty import CollectStreams, FunctionSnapshot, MontyTypingError

from bench.run_bench import machine, snippet
from durable_codemode.worker._pool import WARM_UP_PROGRAM
from durable_codemode.workflow._stubs import TYPE_CHECK_PRELUDE

STUBS = TYPE_CHECK_PRELUDE + 'async def get(i: int) -> int:\n    """Get the value of item i."""\n    ...\n'
PROGRAMS = {
    "gather-20": snippet("gather", 20),
    "sequential-20": snippet("sequential", 20),
    "rows (sort, json, re)": ("import json, re\nrows = [{'a': i, 'b': str(i)} for i in range(5)]\n"
                              "rows.sort(key=lambda r: r['a'])\nout = json.dumps(rows)\nm = re.match('x', out)\n"
                              "v = await get(i=len(out))\nv"),
}


def _timed(step: Callable[[pydantic_monty.MontySession], object], session: pydantic_monty.MontySession) -> float:
    start = time.perf_counter()
    step(session)
    return time.perf_counter() - start


def _end(session: pydantic_monty.MontySession) -> None:
    session.__exit__(None, None, None)


def _warm_up(session: pydantic_monty.MontySession) -> None:
    try:
        session.feed_start(WARM_UP_PROGRAM, print_callback=CollectStreams())
    except MontyTypingError:
        return
    raise AssertionError("the warm-up program was not rejected")


def measure(pool: pydantic_monty.Monty, code: str, reps: int) -> dict[str, float]:
    cold: list[float] = []
    warm_up: list[float] = []
    warmed: list[float] = []
    end_checked: list[float] = []
    end_loaded: list[float] = []
    for _ in range(reps):
        session = pool.checkout(type_check=True, type_check_stubs=STUBS, script_name="snippet.py")
        session.__enter__()
        start = time.perf_counter()
        snap = session.feed_start(code, print_callback=CollectStreams())
        cold.append(time.perf_counter() - start)
        assert isinstance(snap, FunctionSnapshot), f"the program did not stop at its first tool call: {snap!r}"
        dump = snap.dump()
        end_checked.append(_timed(_end, session))
        session = pool.checkout(type_check=True, type_check_stubs=STUBS, script_name="snippet.py")
        session.__enter__()
        warm_up.append(_timed(_warm_up, session))
        warmed.append(_timed(lambda s: s.feed_start(code, print_callback=CollectStreams()), session))
        session.__exit__(None, None, None)
        session = pool.checkout(type_check=True, type_check_stubs=STUBS, script_name="snippet.py")
        session.__enter__()
        session.load_snapshot(dump, print_callback=CollectStreams())
        end_loaded.append(_timed(_end, session))
    return {"cold": statistics.median(cold), "warm_up": statistics.median(warm_up),
            "warmed": statistics.median(warmed), "end_checked": statistics.median(end_checked),
            "end_loaded": statistics.median(end_loaded)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=9, help="sessions per program (median)")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    print(machine(), flush=True)
    header = ["program", "first check, cold", "warm-up (off the thread)", "first check, warmed", "warmed/cold",
              "end, checked", "end, loaded"]
    rows: list[list[str]] = []
    with pydantic_monty.Monty(max_processes=2, checkout_timeout=5) as pool:
        measure(pool, PROGRAMS["gather-20"], 1)  # warm-up: the processes, the binary's pages
        for name, code in PROGRAMS.items():
            m = measure(pool, code, args.reps)
            rows.append([name, *(f"{m[k] * 1000:.2f} ms" for k in ("cold", "warm_up", "warmed")),
                         f"{m['warmed'] / m['cold']:.2f}x", f"{m['end_checked'] * 1000:.2f} ms",
                         f"{m['end_loaded'] * 1000:.2f} ms"])
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    print(" | ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    print(f"medians of {args.reps} session(s) per program; one Monty pool of 2 processes; type checking on, with the "
          "runtime's stubs prelude and the bench agent's tool stub")


if __name__ == "__main__":
    main()
