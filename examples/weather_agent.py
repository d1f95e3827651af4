"""Example of Pydantic AI with multiple tools which the LLM needs to call in turn to answer a question.

In this case the idea is a "weather" agent — the user can ask for the weather in multiple cities,
the agent will use the `get_lat_lng` tool to get the latitude and longitude of the locations, then use
the `get_weather` tool to get the weather.

Run with:

    python -m examples.weather_agent

Made durable (docs/examples.md): `Deps.client` is the worker's HTTP client (`deps_factory`; runs record nothing);
`main` serves the agent and runs it; logfire is not used. No network: the worker's client answers the demo
endpoints from local data (`LOCAL_ENDPOINTS`, an `httpx.MockTransport`), so the tools are unchanged.
"""

from __future__ import annotations as _annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx
from httpx import AsyncClient
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Caching
from temporalio.client import Client

from durable_codemode import CodeModeAgent, create_worker, run_agent, run_script
from examples._temporal import temporal


@dataclass
class Deps:
    client: AsyncClient


weather_agent = Agent(
    'openai:gpt-5-mini',
    # 'Be concise, reply with one sentence.' is enough for some models (like openai) to use
    # the below tools appropriately, but others like anthropic and gemini require a bit more direction.
    instructions='Be concise, reply with one sentence.',
    deps_type=Deps,
    retries=2,
    capabilities=[Caching()],
)


class LatLng(BaseModel):
    lat: float
    lng: float


@weather_agent.tool
async def get_lat_lng(ctx: RunContext[Deps], location_description: str) -> LatLng:
    """Get the latitude and longitude of a location.

    Args:
        ctx: The context.
        location_description: A description of a location.

    """
    # NOTE: the response here will be random, and is not related to the location description.
    r = await ctx.deps.client.get(
        'https://demo-endpoints.pydantic.workers.dev/latlng',
        params={'location': location_description},
    )
    r.raise_for_status()
    return LatLng.model_validate_json(r.content)


@weather_agent.tool
async def get_weather(ctx: RunContext[Deps], lat: float, lng: float) -> dict[str, Any]:
    """Get the weather at a location.

    Args:
        ctx: The context.
        lat: Latitude of the location.
        lng: Longitude of the location.

    """
    # NOTE: the responses here will be random, and are not related to the lat and lng.
    temp_response, descr_response = await asyncio.gather(
        ctx.deps.client.get(
            'https://demo-endpoints.pydantic.workers.dev/number',
            params={'min': 10, 'max': 30},
        ),
        ctx.deps.client.get(
            'https://demo-endpoints.pydantic.workers.dev/weather',
            params={'lat': lat, 'lng': lng},
        ),
    )
    temp_response.raise_for_status()
    descr_response.raise_for_status()
    return {
        'temperature': f'{temp_response.text} °C',
        'description': descr_response.text,
    }


PLACES = {'london': (51.5072, -0.1276), 'wiltshire': (51.3492, -1.9927)}
"""Local data behind the demo endpoints: where each place is (any other place is at 0, 0)."""


def _local_endpoint(request: httpx.Request) -> httpx.Response:
    """The demo endpoints, answered from `PLACES` (as they do, not from the real weather)."""
    if request.url.path == '/latlng':
        lat, lng = PLACES.get(request.url.params['location'].lower(), (0.0, 0.0))
        return httpx.Response(200, content=json.dumps({'lat': lat, 'lng': lng}))
    if request.url.path == '/number':
        return httpx.Response(200, text=str((int(request.url.params['min']) + int(request.url.params['max'])) // 2))
    return httpx.Response(200, text='Sunny' if float(request.url.params['lat']) > 51.4 else 'Light rain')


LOCAL_ENDPOINTS = httpx.MockTransport(_local_endpoint)
TASK_QUEUE = 'weather_agent'


async def main(temporal_client: Client | None = None) -> None:
    async with AsyncClient(transport=LOCAL_ENDPOINTS) as client:
        durable_agent = CodeModeAgent(weather_agent, name='weather_agent', deps_factory=lambda _: Deps(client=client))
        async with temporal(temporal_client) as temporal_client, create_worker(
            temporal_client, [durable_agent], task_queue=TASK_QUEUE
        ):
            result = await run_agent(
                temporal_client, durable_agent, 'What is the weather like in London and in Wiltshire?', task_queue=TASK_QUEUE
            )
        print('Response:', result.output)


if __name__ == '__main__':
    run_script(main())
