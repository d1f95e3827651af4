"""Long-horizon benchmark tasks: multi-step jobs over 60-500 records, where each step depends on the last.

- `cart.cap-and-budget` (`LONG_CART_TASK`): over a cart of 60-500 lines, cap every quantity at 3, then remove
  the most expensive lines until the cart fits a budget, then report. Step 2 depends on step 1 (a line's cost
  after the cap decides whether it goes), and the oracle recomputes the exact end state from the seeded cart.
- The job across two apps, `cart-inventory.stock-check`, is in `workflows.cart_inventory`.

A real model gets the same prompt; the scripted models (code mode and tool calling) play a careful model's part.
"""

from __future__ import annotations

from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models import Model

from durable_codemode import CodeModeAgent, SnippetLimits
from durable_codemode.apps.activities.cart import CartLine, CartStore, CartTools
from durable_codemode.apps.workflows.cart import INSTRUCTIONS as CART_INSTRUCTIONS
from durable_codemode.apps.workflows.cart import format_cents
from durable_codemode.apps.workflows.tasks import (
    Call,
    Mode,
    Seen,
    Task,
    as_json,
    numbers_in,
    summary_answer,
    tool_calling_model,
)
from durable_codemode.testing import RunCode, scripted_model

__all__ = ["LONG_CART_TASK", "LONG_LIMITS", "LONG_SIZES", "CapAndBudgetInstance"]

LONG_SIZES = (60, 200, 500)
"""The record counts the long-horizon tasks run at by default."""

LONG_LIMITS = SnippetLimits(max_model_requests=200)
"""A tool-calling model needs one request per batch of calls: hundreds of calls are dozens of requests."""

CAP = 3
"""The quantity cap of `cart.cap-and-budget`."""

BUDGET_CENTS_PER_LINE = 8_000
"""The budget is $80.00 per seeded line, below what the capped cart averages (~$110 a line), so the most
expensive lines, a tenth to a fifth of them, have to go."""

_PROGRAM = """\
import asyncio

lines = []
offset: int | None = 0
while offset is not None:
    page = await list_cart(offset=offset)
    lines.extend(page['items'])
    offset = page['next_offset']
over_cap = [l for l in lines if l['quantity'] > CAP]
await asyncio.gather(*(update_quantity(line_id=l['line_id'], quantity=CAP) for l in over_cap))
for l in over_cap:
    l['quantity'] = CAP
total = sum(l['unit_price_cents'] * l['quantity'] for l in lines)
by_cost = sorted(lines, key=lambda l: (l['unit_price_cents'] * l['quantity'], l['line_id']), reverse=True)
removed = []
for l in by_cost:
    if total <= BUDGET:
        break
    removed.append(l)
    total -= l['unit_price_cents'] * l['quantity']
await asyncio.gather(*(remove_line(line_id=l['line_id']) for l in removed))
{'over_cap': len(over_cap), 'removed': len(removed), 'total_cents': total, 'lines_left': len(lines) - len(removed)}
"""


def _cost(line: CartLine) -> int:
    return line["unit_price_cents"] * line["quantity"]


def _capped(lines: list[CartLine]) -> list[CartLine]:
    return [CartLine(line_id=line["line_id"], product=line["product"], unit_price_cents=line["unit_price_cents"],
                     quantity=min(line["quantity"], CAP)) for line in lines]


def _plan(lines: list[CartLine], budget_cents: int) -> tuple[list[CartLine], list[CartLine]]:
    """The capped lines and the ones to remove, most expensive first, until the total fits the budget."""
    capped = _capped(lines)
    total = sum(_cost(line) for line in capped)
    removed: list[CartLine] = []
    for line in sorted(capped, key=lambda line: (_cost(line), line["line_id"]), reverse=True):
        if total <= budget_cents:
            break
        removed.append(line)
        total -= _cost(line)
    return capped, removed


def _reply(over_cap: int, removed: int, total_cents: int, lines_left: int) -> str:
    return (f"{over_cap} lines had more than {CAP} units and were capped at {CAP}; I removed {removed} lines; "
            f"the cart now has {lines_left} lines totalling {format_cents(total_cents)}.")


_answer = summary_answer("tidy your cart", lambda s: _reply(s["over_cap"], s["removed"], s["total_cents"],
                                                          s["lines_left"]))
"""The scripted code-mode model's final answer."""


class CapAndBudgetInstance:
    """`cart.cap-and-budget` at N lines (see `workflows.tasks.Instance`)."""

    def __init__(self, workdir: Path, n: int) -> None:
        """Seed a cart of `n` lines in `workdir`; the budget is `BUDGET_CENTS_PER_LINE` per line."""
        self.store = CartStore(workdir / "cart.sqlite")
        self.store.seed(lines=n, seed=n)
        self.before = self.store.all_lines()
        self.budget_cents = BUDGET_CENTS_PER_LINE * n
        self.prompt = (
            f"Tidy my cart in three steps. 1. Cap quantities: every line with more than {CAP} units goes down to "
            f"{CAP}. 2. Then, while the cart's total is over {format_cents(self.budget_cents)}, remove its most "
            f"expensive line (the highest unit price times quantity after the cap; on a tie, the higher line_id). "
            f"3. Tell me how many lines had more than {CAP} units, how many lines you removed, how many lines are "
            "left and the cart's total now."
        )

    def _policy(self, seen: list[Seen]) -> list[Call] | str:
        """Page through the whole cart, then cap (every cap decidable at once), then remove, then answer."""
        pages = [s.result for s in seen if s.tool == "list_cart" and s.ok]
        if not pages:
            return [Call("list_cart", {"offset": 0})]
        if pages[-1]["next_offset"] is not None:
            return [Call("list_cart", {"offset": pages[-1]["next_offset"]})]
        lines: list[CartLine] = [line for page in pages for line in page["items"]]
        capped_ids = {s.args["line_id"] for s in seen if s.tool == "update_quantity"}
        caps = [Call("update_quantity", {"line_id": line["line_id"], "quantity": CAP})
                for line in lines if line["quantity"] > CAP and line["line_id"] not in capped_ids]
        if caps:
            return caps
        capped, removed = _plan(lines, self.budget_cents)
        removed_ids = {s.args["line_id"] for s in seen if s.tool == "remove_line"}
        removals = [Call("remove_line", {"line_id": line["line_id"]})
                    for line in removed if line["line_id"] not in removed_ids]
        if removals:
            return removals
        total = sum(_cost(line) for line in capped) - sum(_cost(line) for line in removed)
        return _reply(len(capped_ids), len(removed), total, len(lines) - len(removed))

    def agent(self, mode: Mode, model: Model | str | None = None) -> CodeModeAgent:
        """The cart agent with the long-horizon limits; scripted for `mode` when `model` is None."""
        if model is None:
            program = _PROGRAM.replace("CAP", str(CAP)).replace("BUDGET", str(self.budget_cents))
            model = (scripted_model(RunCode(program), _answer, name="scripted-cart-cap-and-budget")
                     if mode == "on" else
                     tool_calling_model(self._policy, name="scripted-tool-calling-cart-cap-and-budget"))
        agent = Agent(model, name="cart", instructions=CART_INSTRUCTIONS, toolsets=[CartTools(self.store).toolset()])
        return CodeModeAgent(agent, code_mode=mode == "on", limits=LONG_LIMITS)

    def check(self, reply: str) -> list[str]:
        """The end state is exactly the capped cart less the greedy removals; the reply states the numbers."""
        capped, removed = _plan(self.before, self.budget_cents)
        removed_ids = {line["line_id"] for line in removed}
        expected = {line["line_id"]: line for line in capped if line["line_id"] not in removed_ids}
        after = {line["line_id"]: line for line in self.store.all_lines()}
        problems: list[str] = []
        for line_id in sorted(expected.keys() | after.keys()):
            want, got = expected.get(line_id), after.get(line_id)
            if want == got:
                continue
            if got is None:
                problems.append(f"line {line_id} was removed but should be in the cart: {as_json(want)}")
            elif want is None:
                problems.append(f"line {line_id} should have been removed (or was added): {as_json(got)}")
            else:
                problems.append(f"line {line_id} is {as_json(got)}, expected {as_json(want)}")
        total = sum(_cost(line) for line in expected.values())
        numbers = numbers_in(reply)
        over_cap = sum(line["quantity"] > CAP for line in self.before)
        for label, value in (("lines over the cap", str(over_cap)), ("lines removed", str(len(removed))),
                             ("lines left", str(len(expected))),
                             ("the total", format_cents(total)[1:].replace(",", ""))):
            if value not in numbers:
                problems.append(f"the reply does not state {label} ({value}): {reply!r}")
        return problems

    def duplicate_effects(self) -> int:
        """Side effects that ran more than once."""
        return self.store.duplicate_effects()


LONG_CART_TASK = Task(
    name="cart.cap-and-budget",
    apps=("cart",),
    kind="long",
    sizes=LONG_SIZES,
    setup=CapAndBudgetInstance,
    description=f"cap every quantity at {CAP}, then remove the most expensive lines until the cart fits a budget",
)
"""The cart's long-horizon task."""
