"""`bench/profile_run.py`'s split of py-spy's samples: which part of the stack, and which thread's, a sample is."""

from __future__ import annotations

from pathlib import Path

from bench.profile_run import HAND_OFF, IDLE, WARM_UP, part_of, read_samples, thread_kind
from durable_codemode.worker import _pool

WORKFLOW = "thread (11): cm-workflow-task_0"
LOOP = "thread (1): MainThread"
GIVE_BACK = "thread (12): durable-codemode-give-back"
POOL = Path(_pool.__file__)


def _line(text: str) -> int:
    """The line of `_pool.py` that holds `text` (py-spy names a frame by its file and line)."""
    return next(n for n, line in enumerate(POOL.read_text().splitlines(), 1) if text in line)


def test_a_workflow_threads_hand_off_to_the_loop_is_its_own_row() -> None:
    frame = "BaseSelectorEventLoop._write_to_self (asyncio/selector_events.py:141)"
    assert part_of(frame, WORKFLOW) == HAND_OFF
    assert part_of(frame, LOOP) == "asyncio"  # the loop's own writes are the loop's


def test_a_helper_thread_waiting_for_work_is_idle_and_waiting_on_monty_is_warm_up() -> None:
    waiting = _line("sessions.get()")
    ending = _line("session.__exit__(None, None, None)")
    assert part_of(f"SandboxPool._end_given_back (durable_codemode/worker/_pool.py:{waiting})", GIVE_BACK) == IDLE
    assert part_of(f"_close_quietly (durable_codemode/worker/_pool.py:{ending})", GIVE_BACK) == WARM_UP


def test_samples_are_counted_by_thread_kind_and_part(tmp_path: Path) -> None:
    raw = tmp_path / "samples.txt"
    raw.write_text(
        f"{WORKFLOW};_WorkItem.run (concurrent/futures/thread.py:58);"
        "BaseSelectorEventLoop._write_to_self (asyncio/selector_events.py:141) 7\n"
        f"{LOOP};BaseEventLoop._run_once (asyncio/base_events.py:1922) 3\n"
        f"{WORKFLOW} 5\n"  # no Python frame: idle
    )
    counts = read_samples(raw)
    assert thread_kind(WORKFLOW) == "workflow" and thread_kind(LOOP) == "loop"
    assert counts["workflow"] == {HAND_OFF: 7, IDLE: 5}
    assert counts["loop"] == {"asyncio": 3}
