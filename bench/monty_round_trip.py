"""What one Monty host round trip costs on this machine, and how much of it is waking threads on other CPUs.

`python bench/monty_round_trip.py [--n 200] [--reps 7]` runs, with no Temporal at all, the benchmark's two
programs (a gather of N awaited calls, and N awaited calls in a row) in one Monty session, answering every
suspension at once, and prints the median microseconds per round trip (`resume` to the next snapshot) in two
placements:

- `free`: as a worker runs them, every thread wherever the kernel puts it;
- `one CPU`: this process's threads (the caller and pydantic-monty's own runtime threads) and every thread of the
  session's sandbox process pinned to the CPU the caller is on, for the session only;
- `after idle`: free, but the caller sleeps `--idle-ms` (default 20) before answering each wait on futures, as a
  live program waits for its calls' activities; only those round trips are counted. Idle threads are slower to
  wake, so this is what a live run's waits cost, where a replay answers at once.

A round trip goes through four threads: the caller hands the answer to pydantic-monty's runtime thread, which
writes it to the sandbox process, whose worker thread computes to the next suspension and writes back, and the
runtime thread wakes the caller. On a VM each wake-up of a thread on another (idle) CPU costs tens of
microseconds; on one CPU they are context switches. Linux only (`os.sched_setaffinity`, `/proc`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

from pydantic_monty import CollectStreams, FunctionSnapshot, FutureSnapshot, Monty, MontyComplete

PROGRAMS = {
    "gather": "import asyncio\nr = await asyncio.gather(*(get(i=i) for i in range({n})))\nsum(r)",
    "sequential": "t = 0\nfor i in range({n}):\n    t += await get(i=i)\nt",
}


def _threads(pid: int | str) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _pin(pids: list[int], cpus: set[int]) -> None:
    for tid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def round_trip_us(pool: Monty, code: str, *, one_cpu: bool, idle_s: float = 0.0) -> float:
    """Median µs per round trip of one run of `code`, answering every suspension at once.

    `idle_s`: sleep that long before answering each wait on futures, and count only those round trips.
    """
    with pool.checkout(type_check=False) as session:
        pid = session.worker_pid
        assert pid is not None, "a checked-out session has its sandbox process"
        threads = _threads("self") + _threads(pid)
        allowed = os.sched_getaffinity(0)
        if one_cpu:
            _pin(threads, {ctypes.CDLL(None).sched_getcpu()})
        try:
            snap = session.feed_start(code, print_callback=CollectStreams())
            trips = []
            while not isinstance(snap, MontyComplete):
                waits = isinstance(snap, FutureSnapshot)
                if waits and idle_s:
                    time.sleep(idle_s)
                start = time.perf_counter()
                if isinstance(snap, FunctionSnapshot):
                    snap = snap.resume({"future": ...})
                elif isinstance(snap, FutureSnapshot):
                    snap = snap.resume({i: {"return_value": i} for i in sorted(snap.pending_call_ids)})
                else:  # pragma: no cover - the programs read no undefined name
                    raise TypeError(f"unexpected snapshot {snap!r}")
                if waits or not idle_s:
                    trips.append(time.perf_counter() - start)
        finally:
            _pin(threads, allowed)
    return statistics.median(trips) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=200, help="calls per program (at most 450: Monty's 1,000 suspensions)")
    parser.add_argument("--reps", type=int, default=7, help="runs per program and placement (median)")
    parser.add_argument("--idle-ms", type=float, default=20.0,
                        help="the caller's sleep before each wait on futures is answered, for `after idle`")
    args = parser.parse_args()
    if not 1 <= args.n <= 450 or args.reps < 1 or args.idle_ms <= 0:
        parser.error("--n must be 1-450, --reps at least 1 and --idle-ms above 0")
    if not sys.platform.startswith("linux"):
        parser.error("this measure pins threads with Linux's sched_setaffinity: run it on Linux")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.run_bench import machine

    print(machine())
    print("program    | free µs/round trip | one CPU µs/round trip | free / one CPU | after idle µs/round trip")
    print("-----------+--------------------+-----------------------+----------------+-------------------------")
    with Monty(max_processes=1, checkout_timeout=5) as pool:
        for kind, template in PROGRAMS.items():
            code = template.format(n=args.n)
            free: list[float] = []
            pinned: list[float] = []
            idle: list[float] = []
            for rep in range(args.reps):  # interleaved, the order alternating
                for one_cpu in (False, True) if rep % 2 == 0 else (True, False):
                    (pinned if one_cpu else free).append(round_trip_us(pool, code, one_cpu=one_cpu))
                idle.append(round_trip_us(pool, code, one_cpu=False, idle_s=args.idle_ms / 1e3))
            f, p, i = statistics.median(free), statistics.median(pinned), statistics.median(idle)
            print(f"{kind:<10} | {f:18.1f} | {p:21.1f} | {f / p:13.2f}x | {i:24.1f}")
    print(f"medians of {args.reps} run(s) of {args.n} calls per program and placement, interleaved; after idle: "
          f"only the answers to waits on futures, each after {args.idle_ms:g} ms asleep")


if __name__ == "__main__":
    main()
