"""Small but complete example of using Pydantic AI to build a support agent for a bank.

Run with:

    python -m examples.bank_support

Made durable (docs/examples.md): `SupportDependencies` holds a live SQLite connection, so each run records only the
customer's id and the worker builds the deps with its own connection (`deps_factory`); `__main__` serves the agent
and runs it (`run_agent`) instead of `run_sync`; the two queries read `self.sqlite_conn`, not a global cursor.
"""

import sqlite3
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Caching
from temporalio.client import Client

from durable_codemode import CodeModeAgent, create_worker, run_agent, run_script
from examples._temporal import temporal


@dataclass
class DatabaseConn:
    """A wrapper over the SQLite connection."""

    sqlite_conn: sqlite3.Connection

    async def customer_name(self, *, id: int) -> str | None:
        res = self.sqlite_conn.execute('SELECT name FROM customers WHERE id=?', (id,))
        row = res.fetchone()
        if row:
            return row[0]
        return None

    async def customer_balance(self, *, id: int) -> float:
        res = self.sqlite_conn.execute('SELECT balance FROM customers WHERE id=?', (id,))
        row = res.fetchone()
        if row:
            return row[0]
        else:
            raise ValueError('Customer not found')


@dataclass
class SupportDependencies:
    customer_id: int
    db: DatabaseConn


class SupportOutput(BaseModel):
    support_advice: str
    """Advice returned to the customer"""
    block_card: bool
    """Whether to block their card or not"""
    risk: int
    """Risk level of query"""


support_agent = Agent(
    'openai:gpt-5.2',
    deps_type=SupportDependencies,
    output_type=SupportOutput,
    instructions=(
        'You are a support agent in our bank, give the '
        'customer support and judge the risk level of their query. '
        "Reply using the customer's name."
    ),
    capabilities=[Caching()],
)


@support_agent.instructions
async def add_customer_name(ctx: RunContext[SupportDependencies]) -> str:
    customer_name = await ctx.deps.db.customer_name(id=ctx.deps.customer_id)
    return f"The customer's name is {customer_name!r}"


@support_agent.tool
async def customer_balance(ctx: RunContext[SupportDependencies]) -> str:
    """Returns the customer's current account balance."""
    balance = await ctx.deps.db.customer_balance(
        id=ctx.deps.customer_id,
    )
    return f'${balance:.2f}'


TASK_QUEUE = 'bank_support'


async def main(client: Client | None = None) -> None:
    with sqlite3.connect(':memory:') as con:
        cur = con.cursor()
        cur.execute('CREATE TABLE customers(id, name, balance)')
        cur.execute("""
            INSERT INTO customers VALUES
                (123, 'John', 123.45)
        """)
        con.commit()

        durable_agent = CodeModeAgent(support_agent, name='bank_support', deps_factory=lambda run: SupportDependencies(
            customer_id=run['customer_id'], db=DatabaseConn(sqlite_conn=con)))
        async with temporal(client) as client, create_worker(client, [durable_agent], task_queue=TASK_QUEUE):
            deps = {'customer_id': 123}
            result = await run_agent(client, durable_agent, 'What is my balance?', deps=deps, task_queue=TASK_QUEUE)
            print(result.output)
            """
            support_advice='Hello John, your current account balance, including pending transactions, is $123.45.' block_card=False risk=1
            """

            result = await run_agent(client, durable_agent, 'I just lost my card!', deps=deps, task_queue=TASK_QUEUE)
            print(result.output)
            """
            support_advice="I'm sorry to hear that, John. We are temporarily blocking your card to prevent unauthorized transactions." block_card=True risk=8
            """


if __name__ == '__main__':
    run_script(main())
