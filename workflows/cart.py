"""The bundled shopping-cart agent: `activities.cart`'s tools behind code mode.

Which model answers, in order:
- the `model` argument of `cart_agent(...)`;
- `CODEMODE_MODEL` (a pydantic-ai model string such as `openai:gpt-5` or `anthropic:claude-sonnet-4-5`), but
  only when `OPENAI_API_KEY` or `ANTHROPIC_API_KEY` is set too, so a stray `CODEMODE_MODEL` on a machine with
  no key never turns the offline demo into a failing network call;
- otherwise `scripted_cart_model()`, which plays the model's part for the demo's one task, offline.

A run can still pick any model per run with `codemode run cart "..." --model openai:gpt-5`.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel

from durable_codemode import CodeModeAgent, ToolOptions
from durable_codemode.apps.activities.cart import CartLine, CartStore, CartTools, check_removed_over, over_threshold
from durable_codemode.apps.workflows.tasks import (
    SCALING_SIZES,
    Call,
    Mode,
    Seen,
    Task,
    numbers_in,
    summary_answer,
    tool_calling_model,
)
from durable_codemode.testing import RunCode, last_result, scripted_model

__all__ = [
    "CART_DB_ENV",
    "CART_TASK",
    "DEFAULT_CART_DB",
    "DEMO_PROMPT",
    "GUARD_CENTS",
    "INSTRUCTIONS",
    "MODEL_ENV",
    "SCRIPTED_MODEL_NAME",
    "CartInstance",
    "agents",
    "cart_agent",
    "cart_db_path",
    "format_cents",
    "guarded_cart_agent",
    "model_from_env",
    "scripted_cart_model",
]

CART_DB_ENV = "CODEMODE_CART_DB"
"""Environment variable with the cart's SQLite file; `codemode demo` points it at a temporary directory."""

DEFAULT_CART_DB = Path("~/.local/share/durable-codemode/cart.sqlite")
"""Where the cart lives when `CODEMODE_CART_DB` is unset (`~` is expanded when read)."""

MODEL_ENV = "CODEMODE_MODEL"
"""Environment variable naming the pydantic-ai model to use instead of the scripted one (needs an API key)."""

_API_KEY_ENVS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")

DEMO_PROMPT = "Remove everything in my cart that costs more than $50 a piece."
"""The demo's task: dozens of paginated reads and single-line removals, one short program in code mode."""

SCRIPTED_MODEL_NAME = "scripted-cart"
"""The `model_name` of `scripted_cart_model()`, as runs record it."""

INSTRUCTIONS = """\
You manage the user's shopping cart with the cart tools, which you call from Python programs via run_code.

- Money is integer cents: unit_price_cents=5000 is $50.00. "More than $50" means unit_price_cents > 5000; \
"$50 or less" includes 5000. A line's cost is unit_price_cents * quantity.
- list_cart returns one page of at most 50 lines. To see the whole cart, page through it in one program: \
start at offset=0 and call again with next_offset until it is None. Never assume the cart fits in one page.
- There is no bulk endpoint: remove or change lines one call at a time, all at once with \
asyncio.gather(*(remove_line(line_id=l['line_id']) for l in lines)).
- Do the filtering and the arithmetic in the program, with integers; return a small summary (counts and \
cent totals), not the raw lines.
- Only change what the user asked for. If the request is ambiguous, ask before changing anything.
- Answer in one or two sentences: what changed (how many lines, what they cost) and what the cart holds now, \
with money written as dollars and cents ($1,234.56).
"""
"""What the agent is told; written for a real model (the scripted one ignores it)."""

_SCRIPTED_PROGRAM = """\
import asyncio

lines = []
offset: int | None = 0
while offset is not None:
    page = await list_cart(offset=offset)
    lines.extend(page['items'])
    offset = page['next_offset']
over = [l for l in lines if l['unit_price_cents'] > 5000]
kept = [l for l in lines if l['unit_price_cents'] <= 5000]
await asyncio.gather(*(remove_line(line_id=l['line_id']) for l in over))
{
    'removed': len(over),
    'removed_cents': sum(l['unit_price_cents'] * l['quantity'] for l in over),
    'remaining': len(kept),
    'remaining_cents': sum(l['unit_price_cents'] * l['quantity'] for l in kept),
}
"""


def format_cents(cents: int) -> str:
    """`123456` → `$1,234.56`, with integer arithmetic so no float ever rounds a price."""
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(cents), 100)
    return f"{sign}${dollars:,}.{rest:02d}"


def _removed_reply(summary: dict[str, Any]) -> str:
    return (
        f"Removed {summary['removed']} lines over $50 each ({format_cents(summary['removed_cents'])}); "
        f"{summary['remaining']} lines remain ({format_cents(summary['remaining_cents'])})."
    )


_answer = summary_answer("change your cart", _removed_reply)
"""The scripted model's final answer, from what its program returned (or how it failed)."""


def scripted_cart_model() -> FunctionModel:
    """A scripted model that plays the model's part for `DEMO_PROMPT`, so the demo and tests run offline.

    It is not an agent of its own: it answers every prompt the same way, as a good model would answer the
    demo's. Turn 1 is one `run_code` program that pages through `list_cart`, removes every line priced over
    5000 cents concurrently and returns counts and cent totals; turn 2 is the answer, built from that result.
    Everything else in the run is real: Temporal, the Monty sandbox, the tool activities, the SQLite store.
    """
    return scripted_model(RunCode(_SCRIPTED_PROGRAM), _answer, name=SCRIPTED_MODEL_NAME)


def model_from_env() -> str | None:
    """`CODEMODE_MODEL` when an OpenAI or Anthropic API key is set too, else `None`: the scripted model."""
    chosen = os.environ.get(MODEL_ENV, "").strip()
    if chosen and any(os.environ.get(key) for key in _API_KEY_ENVS):
        return chosen
    return None


def cart_db_path() -> Path:
    """The cart's SQLite file: `CODEMODE_CART_DB` if set, else `DEFAULT_CART_DB`."""
    return Path(os.environ.get(CART_DB_ENV) or DEFAULT_CART_DB).expanduser()


def cart_agent(store: CartStore, *, model: Model | str | None = None) -> CodeModeAgent:
    """The cart agent over `store`.

    Args:
        store: The cart it manages; its tools read and change this SQLite file.
        model: A pydantic-ai model or model string; `None`: `CODEMODE_MODEL` if an API key is set too,
            else `scripted_cart_model()` (see the module docstring).

    """
    chosen: Model | str = model or model_from_env() or scripted_cart_model()
    agent = Agent(chosen, name="cart", instructions=INSTRUCTIONS, toolsets=[CartTools(store).toolset()])
    return CodeModeAgent(agent)


GUARD_CENTS = 10_000
"""In the `cart-guarded` agent, adding a line that costs more than this ($100) in all waits for a person."""

GUARDED_PROMPT = "Add an espresso machine for $150"
_GUARDED_PROGRAM = "await add_line(product='espresso machine', unit_price_cents=15000)"


def _over_the_guard(args: dict[str, Any]) -> bool:
    """The approval rule of `cart-guarded`'s `add_line`: a pure function of the call's arguments."""
    return int(args.get("unit_price_cents", 0)) * int(args.get("quantity", 1)) > GUARD_CENTS


def _guarded_answer(messages: list[ModelMessage]) -> str:
    outcome = last_result(messages)
    if "error" in outcome:
        return f"Not added: {outcome['error']}"
    line = outcome.get("result") or {}
    price = format_cents(line.get("unit_price_cents", 0))
    return f"Added line {line.get('line_id')}: {line.get('product')} at {price}."


def guarded_cart_agent(store: CartStore, *, model: Model | str | None = None) -> CodeModeAgent:
    """The cart agent with one gated call: adding a line over `GUARD_CENTS` waits for a person's approval.

    So `codemode dev` shows a pause: `codemode run cart-guarded "Add an espresso machine for $150"` waits at the
    call until `codemode approve` (or the `decide` update) decides it. Its scripted model, offline, writes that
    one program whatever the prompt, then answers from what it returned.
    """
    chosen: Model | str = model or model_from_env() or scripted_model(
        RunCode(_GUARDED_PROGRAM), _guarded_answer, name=SCRIPTED_MODEL_NAME)
    agent = Agent(chosen, name="cart-guarded", toolsets=[CartTools(store).toolset()],
                  instructions=INSTRUCTIONS + " Adding a line over $100 waits for a person's approval.")
    return CodeModeAgent(agent, tool_options={
        "add_line": ToolOptions(approval_rule=_over_the_guard, approval_timeout=timedelta(hours=24))})


def agents() -> list[CodeModeAgent]:
    """The agents the bundled worker serves, over `cart_db_path()` (seeded with 122 lines if new).

    The cart, and `cart-guarded`, whose adds over $100 wait for approval.
    """
    path = cart_db_path()
    store = CartStore(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        store.seed(lines=122)
    return [cart_agent(store), guarded_cart_agent(store)]


# -- the benchmark task ------------------------------------------------------------------------------------------


def _tool_calling_policy(seen: list[Seen]) -> list[Call] | str:
    """Page through the whole cart first (removing while paging would shift the offsets), then remove."""
    pages = [s.result for s in seen if s.tool == "list_cart" and s.ok]
    if not pages:
        return [Call("list_cart", {"offset": 0})]
    if pages[-1]["next_offset"] is not None:
        return [Call("list_cart", {"offset": pages[-1]["next_offset"]})]
    lines = [line for page in pages for line in page["items"]]
    removed = {s.args["line_id"] for s in seen if s.tool == "remove_line"}
    over = [line for line in lines if line["unit_price_cents"] > 5000]
    todo = [Call("remove_line", {"line_id": line["line_id"]}) for line in over if line["line_id"] not in removed]
    if todo:
        return todo
    kept = [line for line in lines if line["unit_price_cents"] <= 5000]
    return (
        f"Removed {len(over)} lines over $50 each ({format_cents(sum(_cost(line) for line in over))}); "
        f"{len(kept)} lines remain ({format_cents(sum(_cost(line) for line in kept))})."
    )


def _cost(line: CartLine) -> int:
    return line["unit_price_cents"] * line["quantity"]


class CartInstance:
    """`cart.remove-over-50` at one N (see `workflows.tasks.Instance`)."""

    def __init__(self, workdir: Path, n: int) -> None:
        """Seed a cart of `n` lines in `workdir`."""
        self.store = CartStore(workdir / "cart.sqlite")
        self.store.seed(lines=n, seed=n)
        self.before = self.store.all_lines()
        self.prompt = DEMO_PROMPT

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The cart agent; scripted for `mode` when `model` is None."""
        scripted: Model = (
            scripted_cart_model() if mode == "on"
            else tool_calling_model(_tool_calling_policy, name="scripted-tool-calling-cart")
        )
        agent = Agent(model or scripted, name="cart", instructions=INSTRUCTIONS,
                      toolsets=[CartTools(self.store).toolset()])
        return CodeModeAgent(agent, code_mode=mode == "on")

    def check(self, reply: str) -> list[str]:
        """The end state is right, and the reply states how many lines were removed and what they cost."""
        problems = check_removed_over(self.store, self.before)
        over = over_threshold(self.before)
        numbers = numbers_in(reply)
        removed_cents = format_cents(sum(_cost(line) for line in over))[1:].replace(",", "")
        for label, expected in (("lines removed", str(len(over))), ("their cost", removed_cents)):
            if expected not in numbers:
                problems.append(f"the reply does not state {label} ({expected}): {reply!r}")
        return problems

    def duplicate_effects(self) -> int:
        """Side effects that ran more than once."""
        return self.store.duplicate_effects()


CART_TASK = Task(
    name="cart.remove-over-50",
    apps=("cart",),
    kind="scaling",
    sizes=SCALING_SIZES,
    setup=CartInstance,
    description="remove every line that costs more than $50 a piece",
)
"""The cart's scaling task."""
