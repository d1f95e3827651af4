from pydantic_ai import Agent
from typing_extensions import TypedDict

from durable_codemode import CodeModeAgent, SnippetLimits, create_worker, run_agent, run_script, start_dev_server
from durable_codemode.testing import RunCode, last_result, scripted_model


class Line(TypedDict):
    line_id: int
    product: str
    unit_price_cents: int


CART = {i: Line(line_id=i, product=f"item {i}", unit_price_cents=100 * i) for i in range(1, 101)}  # your database

# The model. This script plays it with a scripted stand-in, so it runs without an API key: turn 0 writes the
# program a model would write, turn 1 answers from what the program returned. With a real model, give the agent
# a model string instead, e.g. Agent("openai:gpt-5", ...) with OPENAI_API_KEY set.
PROGRAM = """\
import asyncio
over = [line['line_id'] for line in await list_cart() if line['unit_price_cents'] > 5000]
await asyncio.gather(*(remove_line(line_id=i) for i in over))
len(over)"""
model = scripted_model(RunCode(PROGRAM), lambda messages: f"Removed {last_result(messages)['result']} lines.")

agent = Agent(model, name="walkthrough-cart", instructions="You manage the user's shopping cart.")


@agent.tool_plain
def list_cart() -> list[Line]:
    """Every line of the user's cart."""
    return list(CART.values())


@agent.tool_plain
def remove_line(line_id: int) -> None:
    """Remove one line from the cart; removing it again does nothing."""
    CART.pop(line_id, None)


cart = CodeModeAgent(agent, limits=SnippetLimits(max_tool_calls=200))
TASK_QUEUE = "walkthrough"  # its own queue: no other worker (`codemode dev`'s bundled agents) takes its runs


async def main() -> None:
    async with await start_dev_server() as server:  # a Temporal dev server in this process, in memory
        client = server.client  # with your own server: client = await durable_codemode.connect()
        async with create_worker(client, [cart], task_queue=TASK_QUEUE):  # the worker: runs the agent's steps
            result = await run_agent(client, cart, "Remove everything over $50 a piece", task_queue=TASK_QUEUE)
    print(result.output)  # Removed 50 lines.
    print(f"{result.usage.requests} model requests, {len(result.nested_calls)} tool calls, each an activity")


run_script(main())  # asyncio.run, then leave without the abort a Temporal client can cause at exit
