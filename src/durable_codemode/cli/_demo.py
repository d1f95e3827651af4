"""`codemode demo`: the cart agent end to end on an in-memory server, its end state checked."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.client import WorkflowFailureError

from .._bundled import bundled_apps
from .._outcome import EXIT_FAILED, EXIT_OK, run_failure_reason
from ..client._devserver import start_dev_server
from ..client._runs import start_run
from ..history._trace import render_tree
from ..shared._results import answer_text
from ..worker._worker import create_worker
from ._output import err, say, server_address, tree_width
from ._serving import model_label


async def demo_command(args: argparse.Namespace) -> int:
    with bundled_apps("codemode demo"):
        from ..apps.workflows import cart

    started = time.monotonic()
    saved_db_env = os.environ.get(cart.CART_DB_ENV)
    with tempfile.TemporaryDirectory(prefix="codemode-demo-") as tmp:
        db = Path(tmp) / "cart.sqlite"
        # For anything in this process that looks the cart up by name; restored when the demo ends.
        os.environ[cart.CART_DB_ENV] = str(db)
        try:
            return await _demo_with_cart(db, args.lines, started)
        finally:
            if saved_db_env is None:
                os.environ.pop(cart.CART_DB_ENV, None)
            else:
                os.environ[cart.CART_DB_ENV] = saved_db_env


async def _demo_with_cart(db: Path, lines: int, started: float) -> int:
    """The demo proper; `started` is when the command began, for the wall time it reports."""
    with bundled_apps("codemode demo"):
        from ..apps.activities.cart import PAGE_SIZE, CartStore, check_removed_over, over_threshold
        from ..apps.workflows import cart

    store = CartStore(db)
    store.seed(lines=lines)
    before = store.all_lines()
    over = over_threshold(before)
    agent = cart.cart_agent(store)
    say("durable-codemode demo: the cart agent on an embedded Temporal dev server (in memory)")
    say(f"  cart    {db} ({len(before)} lines, {len(over)} over $50, pages of {PAGE_SIZE})")
    say(f"  model   {model_label(agent)}")
    say(f"  prompt  {cart.DEMO_PROMPT}")
    async with await start_dev_server() as env:
        client = env.client
        task_queue = f"demo-{uuid.uuid4().hex[:10]}"
        say(f"  server  {server_address(client)}, task queue {task_queue}")
        async with create_worker(client, [agent], task_queue=task_queue):
            handle = await start_run(client, agent.name, cart.DEMO_PROMPT, task_queue=task_queue)
            say(f"run {handle.id} started")
            run_started = time.monotonic()
            try:
                result = await handle.result()
            except WorkflowFailureError as e:
                err(f"run {handle.id} failed: {run_failure_reason(e)}")
                return EXIT_FAILED
            run_seconds = time.monotonic() - run_started
    say(f"\nanswer: {answer_text(result.output)}\n")
    say(render_tree(result, width=tree_width()))
    problems = check_removed_over(store, before)
    duplicates = store.duplicate_effects()
    if duplicates:
        problems.append(f"{duplicates} tool calls ran their side effect more than once")
    say()
    if problems:
        say(f"end state: {len(problems)} problems")
        for problem in problems:
            say(f"  - {problem}")
    else:
        removed = store.execution_count("remove_line")
        say(f"end state: correct ({len(over)} lines over $50 removed, {len(before) - len(over)} kept, "
             f"{removed} removals, none repeated)")
    usage = result.usage
    say(f"time: {run_seconds:.2f} s for the run, {time.monotonic() - started:.2f} s in all "
         "(with server start and stop)")
    say(f"usage: {usage.requests} model requests, {usage.input_tokens} input tokens, "
         f"{usage.output_tokens} output tokens")
    return EXIT_FAILED if problems else EXIT_OK
