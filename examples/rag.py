"""RAG example with pydantic-ai — using vector search to augment a chat agent.

Build the search DB and ask the agent a question with (SQLite, no database server, no network):

    python -m examples.rag search "How do I configure logfire to work with FastAPI?"

Made durable (docs/examples.md): pgvector became SQLite (aiosqlite, with an `l2_distance` function), so
`Deps.pool` is the worker's SQLite connection (`deps_factory`; runs record nothing); the documentation sections
are local (`LOCAL_DOCS`, a few sections written for this example) and so are their embeddings: the worker's
`AsyncOpenAI` client answers `embeddings.create` from a local hashing embedder (`LOCAL_EMBEDDINGS`), so the tool
calls it unchanged; `run_agent` serves and runs the agent; logfire is not used.
"""

from __future__ import annotations as _annotations

import asyncio
import hashlib
import json
import math
import re
import sqlite3
import sys
import unicodedata
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiosqlite
import httpx
import pydantic_core
from openai import AsyncOpenAI
from pydantic import TypeAdapter
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Caching
from temporalio.client import Client
from typing_extensions import AsyncGenerator

from durable_codemode import CodeModeAgent, create_worker, run_script
from durable_codemode import run_agent as run_durable_agent
from examples._temporal import temporal


@dataclass
class Deps:
    openai: AsyncOpenAI
    pool: aiosqlite.Connection


agent = Agent('openai:gpt-5.2', deps_type=Deps, capabilities=[Caching()])


@agent.tool
async def retrieve(context: RunContext[Deps], search_query: str) -> str:
    """Retrieve documentation sections based on a search query.

    Args:
        context: The call context.
        search_query: The search query.

    """
    embedding = await context.deps.openai.embeddings.create(
        input=search_query,
        model='text-embedding-3-small',
    )

    assert len(embedding.data) == 1, (
        f'Expected 1 embedding, got {len(embedding.data)}, doc query: {search_query!r}'
    )
    embedding = embedding.data[0].embedding
    embedding_json = pydantic_core.to_json(embedding).decode()
    rows = await context.deps.pool.execute_fetchall(
        'SELECT url, title, content FROM doc_sections ORDER BY l2_distance(embedding, ?) LIMIT 8',
        (embedding_json,),
    )
    return '\n\n'.join(
        f'# {row["title"]}\nDocumentation URL:{row["url"]}\n\n{row["content"]}\n'
        for row in rows
    )


TASK_QUEUE = 'rag'


async def run_agent(question: str, client: Client | None = None):
    """Entry point to run the agent and perform RAG based question answering."""
    openai = local_openai()

    async with database_connect(False) as pool:
        durable_agent = CodeModeAgent(agent, name='rag', deps_factory=lambda _: Deps(openai=openai, pool=pool))
        async with temporal(client) as client, create_worker(client, [durable_agent], task_queue=TASK_QUEUE):
            answer = await run_durable_agent(client, durable_agent, question, task_queue=TASK_QUEUE)
    print(answer.output)


#######################################################
# The rest of this file is dedicated to preparing the #
# search database, and some utilities.                #
#######################################################

# A few documentation sections, written for this example (pydantic-ai's downloads logfire's docs from a gist)
LOCAL_DOCS = [
    {'id': 1, 'parent': None, 'path': 'integrations/fastapi.md', 'level': 1, 'title': 'FastAPI',
     'content': 'Call logfire.configure() once, then logfire.instrument_fastapi(app) to trace every FastAPI request.'},
    {'id': 2, 'parent': None, 'path': 'integrations/httpx.md', 'level': 1, 'title': 'HTTPX',
     'content': 'logfire.instrument_httpx() traces the requests an httpx client makes.'},
    {'id': 3, 'parent': None, 'path': 'guides/first-steps.md', 'level': 1, 'title': 'First steps',
     'content': 'Install logfire, run logfire auth, then call logfire.configure() at the start of your program.'},
    {'id': 4, 'parent': None, 'path': 'guides/sampling.md', 'level': 1, 'title': 'Sampling',
     'content': 'Sample traces by passing sampling options to logfire.configure().'},
]


def _local_embedding(text: str, dimensions: int = 64) -> list[float]:
    """A deterministic bag-of-words embedding (no model): each word hashed into one of `dimensions`."""
    vector = [0.0] * dimensions
    for word in re.findall(r'[a-z0-9_]+', text.lower()):
        vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % dimensions] += 1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def _embeddings_endpoint(request: httpx.Request) -> httpx.Response:
    """OpenAI's `/embeddings`, answered by `_local_embedding`."""
    body = json.loads(request.content)
    data = [{'object': 'embedding', 'index': 0, 'embedding': _local_embedding(body['input'])}]
    return httpx.Response(200, json={'object': 'list', 'data': data, 'model': body['model'],
                                     'usage': {'prompt_tokens': 0, 'total_tokens': 0}})


LOCAL_EMBEDDINGS = httpx.MockTransport(_embeddings_endpoint)


def local_openai() -> AsyncOpenAI:
    """An OpenAI client whose embeddings come from `LOCAL_EMBEDDINGS` (no key, no network)."""
    return AsyncOpenAI(api_key='local', base_url='http://local/v1',
                       http_client=httpx.AsyncClient(transport=LOCAL_EMBEDDINGS))


async def build_search_db():
    """Build the search database."""
    sections = sections_ta.validate_python(LOCAL_DOCS)

    openai = local_openai()

    async with database_connect(True) as pool:
        await pool.executescript(DB_SCHEMA)
        for section in sections:
            await insert_doc_section(openai, pool, section)


async def insert_doc_section(
    openai: AsyncOpenAI,
    pool: aiosqlite.Connection,
    section: DocsSection,
) -> None:
    url = section.url()
    embedding = await openai.embeddings.create(
        input=section.embedding_content(),
        model='text-embedding-3-small',
    )
    assert len(embedding.data) == 1, (
        f'Expected 1 embedding, got {len(embedding.data)}, doc section: {section}'
    )
    embedding = embedding.data[0].embedding
    embedding_json = pydantic_core.to_json(embedding).decode()
    await pool.execute(
        'INSERT OR IGNORE INTO doc_sections (url, title, content, embedding) VALUES (?, ?, ?, ?)',
        (url, section.title, section.content, embedding_json),
    )
    await pool.commit()


@dataclass
class DocsSection:
    id: int
    parent: int | None
    path: str
    level: int
    title: str
    content: str

    def url(self) -> str:
        url_path = re.sub(r'\.md$', '', self.path)
        return (
            f'https://logfire.pydantic.dev/docs/{url_path}/#{slugify(self.title, "-")}'
        )

    def embedding_content(self) -> str:
        return '\n\n'.join((f'path: {self.path}', f'title: {self.title}', self.content))


sections_ta = TypeAdapter(list[DocsSection])


# pyright: reportUnknownMemberType=false
# pyright: reportUnknownVariableType=false
DATABASE = 'rag.sqlite'
"""The search DB: a SQLite file in the working directory."""


def _l2_distance(a: str, b: str) -> float:
    return math.dist(json.loads(a), json.loads(b))


@asynccontextmanager
async def database_connect(
    create_db: bool = False,
) -> AsyncGenerator[aiosqlite.Connection, None]:
    async with aiosqlite.connect(DATABASE) as pool:
        pool.row_factory = sqlite3.Row
        await pool.create_function('l2_distance', 2, _l2_distance, deterministic=True)
        yield pool


DB_SCHEMA = """
CREATE TABLE IF NOT EXISTS doc_sections (
    id integer PRIMARY KEY,
    url text NOT NULL UNIQUE,
    title text NOT NULL,
    content text NOT NULL,
    -- the local embedding: 64 floats, as JSON
    embedding text NOT NULL
);
"""


def slugify(value: str, separator: str, unicode: bool = False) -> str:
    """Slugify a string, to make it URL friendly."""
    # Taken unchanged from https://github.com/Python-Markdown/markdown/blob/3.7/markdown/extensions/toc.py#L38
    if not unicode:
        # Replace Extended Latin characters with ASCII, i.e. `žlutý` => `zluty`
        value = unicodedata.normalize('NFKD', value)
        value = value.encode('ascii', 'ignore').decode('ascii')
    value = re.sub(r'[^\w\s-]', '', value).strip().lower()
    return re.sub(rf'[{separator}\s]+', separator, value)


if __name__ == '__main__':
    action = sys.argv[1] if len(sys.argv) > 1 else None
    if action == 'build':
        asyncio.run(build_search_db())  # no Temporal client: asyncio.run is enough
    elif action == 'search':
        if len(sys.argv) == 3:
            q = sys.argv[2]
        else:
            q = 'How do I configure logfire to work with FastAPI?'
        asyncio.run(build_search_db())  # no Temporal client yet: asyncio.run is enough
        run_script(run_agent(q))
    else:
        print(
            'python -m examples.rag build|search',
            file=sys.stderr,
        )
        sys.exit(1)
