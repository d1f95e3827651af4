"""System prompts reach the model as in `agent.run()`: static and from `@agent.system_prompt`, with the run's deps.

They were once dropped without a word: the durable run's first request carried only the user's prompt.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, SystemPromptPart, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.client import Client

from durable_codemode import CodeModeAgent, InvalidRunInputError, start_run
from durable_codemode.testing import new_task_queue, replay, running_worker

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


@dataclass
class User:
    name: str


def _agent(seen: list[list[str]]) -> Agent[User, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append([p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
                     if isinstance(p, SystemPromptPart)])
        return ModelResponse(parts=[TextPart("hello")])

    agent = Agent(FunctionModel(model), name="greeter", deps_type=User, system_prompt="Be brief.")

    @agent.system_prompt
    def whom(ctx: RunContext[User]) -> str:
        return f"The user is {ctx.deps.name}."

    return agent


async def test_system_prompts_open_a_new_conversation_as_in_agent_run(client: Client) -> None:
    history = [ModelRequest(parts=[UserPromptPart("earlier")]), ModelResponse(parts=[TextPart("ok")])]
    plain: list[list[str]] = []
    await _agent(plain).run("hi", deps=User("ana"))
    await _agent(plain).run("hi again", deps=User("ana"), message_history=history)
    assert plain == [["Be brief.", "The user is ana."], []]

    durable: list[list[str]] = []
    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(_agent(durable))], task_queue=tq):
        handle = await start_run(client, "greeter", "hi", task_queue=tq, deps=User("ana"))
        assert (await handle.result()).output == "hello"
        # A conversation continued from a history gets none, as with agent.run(message_history=...).
        continued = await start_run(client, "greeter", "hi again", task_queue=tq, deps=User("ana"),
                                    message_history=history)
        await continued.result()
    assert durable == plain
    await replay(handle)
    await replay(continued)


async def test_a_runs_own_instructions_join_the_agents_as_in_agent_run(client: Client) -> None:
    seen: list[str | None] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info.instructions)
        return ModelResponse(parts=[TextPart("bonjour")])

    agent = Agent(FunctionModel(model), name="instructed", instructions="Be brief.")
    await agent.run("hi", instructions="Answer in French.")
    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(agent)], task_queue=tq):
        handle = await start_run(client, "instructed", "hi", task_queue=tq, instructions="Answer in French.")
        assert (await handle.result()).output == "bonjour"
        plain_again = await start_run(client, "instructed", "hi", task_queue=tq)  # another run: the agent's only
        await plain_again.result()
    assert seen[1] == seen[0] and "Answer in French." in (seen[0] or "") and "Be brief." in (seen[0] or "")
    assert seen[2] is not None and "French" not in seen[2]
    with pytest.raises(InvalidRunInputError, match="instructions must be a string"):
        await start_run(client, "instructed", "hi", task_queue=tq, instructions=["Answer in French."])  # type: ignore[arg-type]
    await replay(handle)


def _dynamic_agent(seen: list[list[str]]) -> Agent[User, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append([str(p.content) for m in messages if isinstance(m, ModelRequest) for p in m.parts
                     if isinstance(p, (SystemPromptPart, UserPromptPart))])
        return ModelResponse(parts=[TextPart("hello")])

    agent = Agent(FunctionModel(model), name="dynamic-greeter", deps_type=User, system_prompt="Be brief.")

    @agent.system_prompt(dynamic=True)
    def whom(ctx: RunContext[User]) -> str:
        return f"The user is {ctx.deps.name}."

    @agent.system_prompt(dynamic=True, on_change="append")
    def plan(ctx: RunContext[User]) -> str:
        return f"Plan: {'pro' if ctx.deps.name == 'bob' else 'free'}."

    return agent


@pytest.mark.skipif("on_change" not in inspect.signature(Agent.system_prompt).parameters,
                    reason="@agent.system_prompt(on_change='append') needs pydantic-ai 2.68 or newer")
async def test_dynamic_system_prompts_are_revalued_in_a_given_history_as_in_agent_run(client: Client) -> None:
    plain: list[list[str]] = []
    first = await _dynamic_agent(plain).run("hi", deps=User("ana"))
    history = first.all_messages()
    await _dynamic_agent(plain).run("hi again", deps=User("bob"), message_history=history)

    durable: list[list[str]] = []
    tq = new_task_queue()
    async with running_worker(client, [CodeModeAgent(_dynamic_agent(durable))], task_queue=tq):
        opened = await start_run(client, "dynamic-greeter", "hi", task_queue=tq, deps=User("ana"))
        await opened.result()
        continued = await start_run(client, "dynamic-greeter", "hi again", task_queue=tq, deps=User("bob"),
                                    message_history=history)
        await continued.result()
    # What the model sees, as rendered for it: in a given history, a 'rewrite' prompt takes the new run's value
    # in place, and an 'append' prompt whose value changed is stated again (as its `<pyai:context>` element).
    assert durable == plain
    assert durable[1][:2] == ["Be brief.", "The user is bob."] and "Plan: free." in durable[1][2]
    assert "Plan: pro." in durable[1][4] and durable[1][5] == "hi again"
    assert history[0].parts[1].content == "The user is ana."  # type: ignore[union-attr]  # the caller's untouched
    await replay(opened)
    await replay(continued)
