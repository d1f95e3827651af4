"""A 300-tool catalog: what the `run_code` description costs with every stub, and with the index.

`python bench/catalog.py [--tools 300]` builds an agent with a generated catalog (30 domains of 10 CRUD-style
tools each, written like the bundled apps' tools: a documented result model per domain, docstrings with an
`Args:` section) and describes it three ways (`VIEWS`): every stub; the index with one line per tool; the
default settings (the index past 40 tools, names only, as a 300-line index with summaries is itself over the
4,000-token budget). In each view it runs one scripted task on a dev server (find 3 tools, read their stubs, call
them) and replays it, then prints one table. Tokens are estimated as characters / 4 (`_stubs.estimate_tokens`).

The generator (`catalog_agent`) is also what `tests/test_large_catalogs.py` runs against.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `bench.run_bench` must be importable

from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.models import Model

from durable_codemode import CatalogSettings, CodeModeAgent, create_worker, start_dev_server, start_run
from durable_codemode.testing import RunCode, last_result, new_task_queue, replay, scripted_model
from durable_codemode.worker._describe import describe_run
from durable_codemode.workflow._stubs import estimate_tokens

DOMAINS = [
    ("account", "accounts"), ("invoice", "invoices"), ("order", "orders"), ("product", "products"),
    ("customer", "customers"), ("shipment", "shipments"), ("ticket", "tickets"), ("contact", "contacts"),
    ("campaign", "campaigns"), ("payment", "payments"), ("refund", "refunds"), ("subscription", "subscriptions"),
    ("warehouse", "warehouses"), ("supplier", "suppliers"), ("employee", "employees"), ("project", "projects"),
    ("task", "tasks"), ("meeting", "meetings"), ("document", "documents"), ("contract", "contracts"),
    ("lead", "leads"), ("opportunity", "opportunities"), ("vendor", "vendors"), ("asset", "assets"),
    ("license", "licenses"), ("device", "devices"), ("alert", "alerts"), ("incident", "incidents"),
    ("deployment", "deployments"), ("release", "releases"),
]
"""30 domains (singular, plural); each gets the 10 tools of `_TOOLS`."""

_RECORD = '''
class {Cls}(BaseModel):
    """One {one} as the {many} service keeps it; amounts in cents, times in UTC (ISO 8601)."""
    {one}_id: str = Field(description="The {one}'s id (e.g. `{one}_00042`); stable and never reused.")
    name: str = Field(description="The {one}'s display name, as people see it in the app.")
    status: str = Field(description="`active`, `archived` or `deleted`; archived {many} are hidden from lists.")
    owner: str = Field(description="Who owns the {one}: an employee's email address.")
    amount_cents: int = Field(description="The {one}'s amount in cents (1250 is $12.50); 0 when it has none.")
    updated_at: str = Field(description="When the {one} last changed, in UTC (ISO 8601).")

class {Cls}Page(BaseModel):
    """One page of `list_{many}`."""
    items: list[{Cls}] = Field(description="At most `limit` {many}, newest first.")
    next_offset: int | None = Field(description="The offset of the next page; None on the last page.")
    total: int = Field(description="How many {many} match, on all pages.")
'''

_TOOLS = '''
def get_{one}({one}_id: str) -> {Cls}:
    """Get one {one} by its id.

    Raises KeyError when there is no such {one}.

    Args:
        {one}_id: The {one}'s id, as `list_{many}` or `search_{many}` show it.
    """
    return _record({Cls}, "{one}", {one}_id)

def list_{many}(offset: int = 0, limit: int = 50, status: str = "active") -> {Cls}Page:
    """List {many} one page at a time, newest first.

    Call again with `next_offset` until it is None to see them all.

    Args:
        offset: How many {many} to skip; 0 for the first page.
        limit: Page size, 1 to 100.
        status: Only {many} with this status (`active`, `archived`, `deleted`).
    """
    return {Cls}Page(items=[_record({Cls}, "{one}", f"{one}_{{offset + i:05d}}") for i in range(min(limit, 3))],
                     next_offset=None, total=3)

def search_{many}(text: str, limit: int = 20) -> list[{Cls}]:
    """Find {many} whose name or owner contains `text` (case-insensitive), best matches first.

    Args:
        text: The words to look for.
        limit: At most this many results, 1 to 100.
    """
    return [_record({Cls}, "{one}", f"{one}_{{i:05d}}") for i in range(min(limit, 2))]

def create_{one}(name: str, owner: str, amount_cents: int = 0) -> {Cls}:
    """Create {a} {one} and return it with its new id.

    Args:
        name: The new {one}'s display name; not empty.
        owner: The owner's email address.
        amount_cents: Its amount in cents, 0 or more.
    """
    return _record({Cls}, "{one}", "{one}_99999", name=name, owner=owner, amount_cents=amount_cents)

def update_{one}({one}_id: str, name: str | None = None, owner: str | None = None,
                 amount_cents: int | None = None) -> {Cls}:
    """Change {a} {one}'s name, owner and/or amount, and return the updated {one}.

    Only the fields given change; give at least one.

    Args:
        {one}_id: The {one} to change.
        name: Its new display name.
        owner: Its new owner's email address.
        amount_cents: Its new amount in cents.
    """
    return _record({Cls}, "{one}", {one}_id, **{{k: v for k, v in
                   dict(name=name, owner=owner, amount_cents=amount_cents).items() if v is not None}})

def delete_{one}({one}_id: str) -> bool:
    """Delete {a} {one} for good; True when it existed.

    Use `archive_{one}` to hide it instead: a deleted {one} cannot be restored.

    Args:
        {one}_id: The {one} to delete.
    """
    return True

def archive_{one}({one}_id: str) -> {Cls}:
    """Archive {a} {one}: it is kept, but hidden from `list_{many}` by default.

    Args:
        {one}_id: The {one} to archive.
    """
    return _record({Cls}, "{one}", {one}_id, status="archived")

def restore_{one}({one}_id: str) -> {Cls}:
    """Restore an archived {one}, making it active again.

    Args:
        {one}_id: The archived {one} to restore.
    """
    return _record({Cls}, "{one}", {one}_id)

def count_{many}(status: str = "active", owner: str | None = None) -> int:
    """Count {many} with a status, optionally only one owner's.

    Args:
        status: `active`, `archived` or `deleted`.
        owner: Only {many} this email address owns; None for everyone's.
    """
    return 42

def export_{many}(since: str, fmt: str = "csv") -> str:
    """Export the {many} changed since a time, as CSV or JSON text.

    Args:
        since: A UTC time (ISO 8601); only {many} updated at or after it.
        fmt: `csv` or `json`.
    """
    return f"{one}_id,name\\n{one}_00001,First {one}\\n"
'''

TOOLS_PER_DOMAIN = 10


def _record(cls: type[BaseModel], one: str, ident: str, **fields: Any) -> BaseModel:
    values: dict[str, Any] = {f"{one}_id": ident, "name": f"{one.title()} {ident[-5:]}", "status": "active",
                              "owner": "alex@example.com", "amount_cents": 1250, "updated_at": "2026-01-02T03:04:05Z"}
    return cls(**{**values, **fields})


def catalog_tools(n_tools: int = 300) -> list[Any]:
    """The first `n_tools` generated tool functions (10 per domain, at most 300), in domain order."""
    if not 1 <= n_tools <= len(DOMAINS) * TOOLS_PER_DOMAIN:
        raise ValueError(f"n_tools must be 1 to {len(DOMAINS) * TOOLS_PER_DOMAIN}, got {n_tools}")
    functions: list[Any] = []
    for one, many in DOMAINS:
        namespace: dict[str, Any] = {"BaseModel": BaseModel, "Field": Field, "_record": _record}
        names = {"Cls": one.title(), "one": one, "many": many, "a": "an" if one[0] in "aeiou" else "a"}
        source = _RECORD.format(**names) + _TOOLS.format(**names)
        # dont_inherit: this module's `from __future__ import annotations` would leave the models' annotations as
        # strings that pydantic cannot resolve outside a module.
        exec(compile(source, f"<catalog:{many}>", "exec", dont_inherit=True), namespace)  # from the templates
        functions += [v for k, v in namespace.items() if callable(v) and not isinstance(v, type)
                      and not k.startswith("_") and k not in ("Field",)]
    return functions[:n_tools]


def catalog_agent(model: Model, *, name: str = "catalog", n_tools: int = 300,
                  catalog: CatalogSettings | None = None) -> CodeModeAgent:
    """A code-mode agent with `n_tools` generated tools and `model` (e.g. a `scripted_model`)."""
    agent = Agent(model, name=name, instructions="Use run_code.")
    for function in catalog_tools(n_tools):
        agent.tool_plain(function)
    return CodeModeAgent(agent, catalog=catalog)


FIND = ["create a refund", "archive contract", "count incidents"]
"""The scripted task's searches; their best hits are the 3 tools it uses."""
EXPECTED = ["archive_contract", "count_incidents", "create_refund"]
"""What the searches find first (asserted by the task, and by the tests)."""

FIND_AND_DESCRIBE = f"""\
hits = [search_tools(q, limit=3) for q in {FIND!r}]
names = sorted(h[0]["name"] for h in hits)
for n in names:
    print(describe_tool(n))
names
"""
USE = """\
import asyncio
refund, archived, open_incidents = await asyncio.gather(
    create_refund(name="Refund for order_00042", owner="alex@example.com", amount_cents=1250),
    archive_contract(contract_id="contract_00007"),
    count_incidents(status="active"))
{"refund": refund["refund_id"], "archived": archived["status"], "open_incidents": open_incidents}
"""


def _checked_names(messages: Any) -> Any:
    found = last_result(messages)["result"]
    assert found == EXPECTED, found
    return RunCode(USE)


def task_steps(*, index: bool) -> list[Any]:
    """The scripted task: with the index, find and describe the tools, then call them; with every stub, call."""
    finish = lambda m: repr(last_result(m)["result"])  # noqa: E731
    return [RunCode(FIND_AND_DESCRIBE), _checked_names, finish] if index else [RunCode(USE), finish]


VIEWS = {
    "every stub": CatalogSettings(mode="stubs"),
    "index, names+summaries": CatalogSettings(max_stub_tokens=100_000),
    "index (default)": CatalogSettings(),
}
"""The views measured: every stub; the index with a line per tool (a budget its summaries fit in); the default
settings, where a 300-tool index with summaries (~6,400 tokens) is over the 4,000-token budget: names only."""


async def _run_task(client: Any, view: str, n_tools: int) -> dict[str, Any]:
    settings = VIEWS[view]
    index = settings.mode != "stubs"
    agent = catalog_agent(scripted_model(*task_steps(index=index)), name=f"catalog-{list(VIEWS).index(view)}",
                          n_tools=n_tools, catalog=settings)
    spec = await describe_run(agent)
    description = spec.model_tools[0].description or ""
    tq = new_task_queue("bench-catalog")
    started = time.monotonic()
    async with create_worker(client, [agent], task_queue=tq):
        handle = await start_run(client, agent.name, "Refund order_00042, archive contract_00007, count incidents.",
                                 task_queue=tq)
        result = await handle.result()
    wall = time.monotonic() - started
    await replay(handle)
    requests = result.usage.requests
    return {"view": view, "tools": len(spec.tools), "chars": len(description),
            "tokens": estimate_tokens(description), "requests": requests,
            "sent": requests * estimate_tokens(description), "calls": len(result.nested_calls),
            "wall": wall, "output": result.output}


async def main(n_tools: int) -> int:
    async with await start_dev_server() as env:
        rows = [await _run_task(env.client, view, n_tools) for view in VIEWS]
    stubs, _summaries, index = rows
    print(f"{n_tools}-tool catalog; tokens = characters / 4; task: find 3 tools, read their stubs, call them")
    print(f"{'run_code description':<24} | {'chars':>8} | {'~tokens':>7} | {'requests':>8} | {'tokens sent':>11} | "
          f"{'tool calls':>10} | {'wall s':>6}")
    print("-" * 25 + "+" + "+".join("-" * (w + 2) for w in (8, 7, 8, 11, 10)) + "+" + "-" * 7)
    for row in rows:
        print(f"{row['view']:<24} | {row['chars']:>8,} | {row['tokens']:>7,} | {row['requests']:>8} | "
              f"{row['sent']:>11,} | {row['calls']:>10} | {row['wall']:>6.2f}")
    for row in rows[1:]:
        print(f"{row['view']} vs every stub: {1 - row['tokens'] / stubs['tokens']:.1%} fewer description tokens "
              f"per request, {1 - row['sent'] / stubs['sent']:.1%} fewer over the task")
    print(f"every run answered {index['output']}")
    return 0 if all(row["output"] == stubs["output"] for row in rows) else 1


if __name__ == "__main__":
    from bench.run_bench import run_and_exit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=300, help="catalog size, 1 to 300 (default 300)")
    run_and_exit(main(parser.parse_args().tools))
