"""What a durable run does not apply yet is refused by name when the agent is wrapped, never silently dropped."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.capabilities import Hooks

from durable_codemode import CodeModeAgent, CodeModeUserError

pytestmark = pytest.mark.pydantic_ai_release  # runs again on the oldest pydantic-ai (docs/development.md)


def test_capabilities_are_refused_by_the_hooks_a_durable_run_would_not_call() -> None:
    hooks = Hooks()
    calls: list[str] = []

    @hooks.on.before_tool_execute
    async def log(ctx, *, call, tool_def, args):  # type: ignore[no-untyped-def]
        calls.append(call.tool_name)
        return args

    assert CodeModeAgent(Agent("test", name="hooked", capabilities=[hooks])).name == "hooked"  # tool hooks: applied

    @hooks.on.before_run
    async def start(ctx):  # type: ignore[no-untyped-def]
        pass

    assert CodeModeAgent(Agent("test", name="hooked", capabilities=[hooks])).name == "hooked"  # before_run: applied

    @hooks.on.after_run
    async def end(ctx, *, result):  # type: ignore[no-untyped-def]
        return result

    assert CodeModeAgent(Agent("test", name="hooked", capabilities=[hooks])).name == "hooked"  # after_run: applied

    @hooks.on.run_error
    async def failed(ctx, *, error):  # type: ignore[no-untyped-def]
        raise error

    assert CodeModeAgent(Agent("test", name="hooked", capabilities=[hooks])).name == "hooked"  # on_run_error too

    @hooks.on.node_run_error
    async def node_failed(ctx, *, node, error):  # type: ignore[no-untyped-def]
        raise error

    with pytest.raises(CodeModeUserError, match=r"'hooked' declares capability hooks: Hooks\.on_node_run_error \(.*"
                                                r"no graph nodes.*model-request hooks.*"):
        CodeModeAgent(Agent("test", name="hooked", capabilities=[hooks]))


def test_batched_model_requests_are_refused_by_name() -> None:
    from pydantic_ai.capabilities import BatchModelRequests

    agent = Agent("test", name="batching", capabilities=[BatchModelRequests()])
    with pytest.raises(CodeModeUserError, match=r"'batching' declares BatchModelRequests \(.*up to a day.*timeout"):
        CodeModeAgent(agent)


def test_deferred_tool_output_is_refused_by_name() -> None:
    agent = Agent("test", name="deferring", output_type=[str, DeferredToolRequests])
    with pytest.raises(CodeModeUserError, match=r"'deferring' declares DeferredToolRequests.*requires_approval"):
        CodeModeAgent(agent)


@pytest.mark.parametrize(("options", "named"), [
    ({"max_concurrency": 2}, r"max_concurrency \(.*max_concurrent_workflow_tasks"),
    ({"metadata": {"team": "billing"}}, r"metadata \(.*tracing=True"),
])
def test_agent_options_a_durable_run_would_not_apply_are_refused_by_name(options: dict[str, object],
                                                                         named: str) -> None:
    with pytest.raises(CodeModeUserError, match=named):
        CodeModeAgent(Agent("test", name="optioned", **options))  # type: ignore[call-overload]


def test_a_plain_agent_is_accepted() -> None:
    assert CodeModeAgent(Agent("test", name="plain")).name == "plain"


async def test_a_sandbox_tool_named_like_a_private_name_is_refused_with_the_fix() -> None:
    from durable_codemode import ToolOptions

    agent = Agent("test", name="private-tool")
    agent.tool_plain(name="_hidden")(lambda x: x)
    with pytest.raises(CodeModeUserError, match=r"'private-tool' has sandbox tools whose names start with '_' "
                                                r"\(_hidden\): programs cannot call them.*Rename them"):
        await CodeModeAgent(agent).tools()
    # A native tool (the model calls it directly) or an agent without code mode keeps the name.
    assert "_hidden" in await CodeModeAgent(agent, tool_options={"_hidden": ToolOptions(in_sandbox=False)}).tools()
    assert "_hidden" in await CodeModeAgent(agent, code_mode=False).tools()
