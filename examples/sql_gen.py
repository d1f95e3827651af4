"""Example demonstrating how to use Pydantic AI to generate SQL queries based on user input.

Run with (SQLite in memory, no database server):

    python -m examples.sql_gen "show me logs from yesterday, with level 'error'"

Made durable (docs/examples.md): PostgreSQL became SQLite (aiosqlite: `Deps.conn` is the worker's connection, built
by `deps_factory`; the schema is unchanged, three of the SQL examples are SQLite's); the model is OpenAI's (the
Google provider is not installed here); `main` serves the agent and runs it; logfire and devtools are not used.
"""

import sqlite3
import sys
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any, TypeAlias

import aiosqlite
from annotated_types import MinLen
from pydantic import BaseModel, Field
from pydantic_ai import Agent, ModelRetry, RunContext, format_as_xml
from pydantic_ai.capabilities import Caching
from temporalio.client import Client

from durable_codemode import CodeModeAgent, create_worker, run_agent, run_script
from examples._temporal import temporal

DB_SCHEMA = """
CREATE TABLE records (
    created_at timestamptz,
    start_timestamp timestamptz,
    end_timestamp timestamptz,
    trace_id text,
    span_id text,
    parent_span_id text,
    level log_level,
    span_name text,
    message text,
    attributes_json_schema text,
    attributes jsonb,
    tags text[],
    is_exception boolean,
    otel_status_message text,
    service_name text
);
"""
SQL_EXAMPLES = [
    {
        'request': 'show me records where foobar is false',
        'response': "SELECT * FROM records WHERE attributes->>'foobar' = false",
    },
    {
        'request': 'show me records where attributes include the key "foobar"',
        'response': "SELECT * FROM records WHERE json_extract(attributes, '$.foobar') IS NOT NULL",
    },
    {
        'request': 'show me records from yesterday',
        'response': "SELECT * FROM records WHERE date(start_timestamp) > date('now', '-1 day')",
    },
    {
        'request': 'show me error records with the tag "foobar"',
        'response': "SELECT * FROM records WHERE level = 'error' and 'foobar' IN (SELECT value FROM json_each(tags))",
    },
]


@dataclass
class Deps:
    conn: aiosqlite.Connection


class Success(BaseModel):
    """Response when SQL could be successfully generated."""

    sql_query: Annotated[str, MinLen(1)]
    explanation: str = Field(
        '', description='Explanation of the SQL query, as markdown'
    )


class InvalidRequest(BaseModel):
    """Response the user input didn't include enough information to generate SQL."""

    error_message: str


Response: TypeAlias = Success | InvalidRequest
agent = Agent[Deps, Response](
    'openai:gpt-5.2',
    # Pass the union members directly: a `Response` type alias isn't yet accepted as a `TypeForm` value (PEP-747)
    output_type=Success | InvalidRequest,
    deps_type=Deps,
    capabilities=[Caching()],
)


@agent.instructions
async def instructions() -> str:
    return f"""\
Given the following SQLite table of records, your job is to
write a SQL query that suits the user's request.

Database schema:

{DB_SCHEMA}

today's date = {date.today()}

{format_as_xml(SQL_EXAMPLES)}
"""


@agent.output_validator
async def validate_output(ctx: RunContext[Deps], output: Response) -> Response:
    if isinstance(output, InvalidRequest):
        return output

    # gemini often adds extraneous backslashes to SQL
    output.sql_query = output.sql_query.replace('\\', '')
    if not output.sql_query.upper().startswith('SELECT'):
        raise ModelRetry('Please create a SELECT query')

    try:
        await ctx.deps.conn.execute(f'EXPLAIN {output.sql_query}')
    except sqlite3.Error as e:
        raise ModelRetry(f'Invalid query: {e}') from e
    else:
        return output


TASK_QUEUE = 'sql_gen'


async def main(client: Client | None = None) -> None:
    if len(sys.argv) == 1:
        prompt = 'show me logs from yesterday, with level "error"'
    else:
        prompt = sys.argv[1]

    async with database_connect(':memory:') as conn:
        durable_agent = CodeModeAgent(agent, name='sql_gen', deps_factory=lambda _: Deps(conn))
        async with temporal(client) as client, create_worker(client, [durable_agent], task_queue=TASK_QUEUE):
            result = await run_agent(client, durable_agent, prompt, task_queue=TASK_QUEUE)
    print(result.output)


@asynccontextmanager
async def database_connect(database: str) -> AsyncGenerator[Any, None]:
    async with aiosqlite.connect(database) as conn:
        await conn.execute(DB_SCHEMA)
        yield conn


if __name__ == '__main__':
    run_script(main())
