"""The `ops` agent's new code, for `codemode check-deploy --worker tests._deploy_new` (see `tests._deploy_agents`)."""

from __future__ import annotations

from durable_codemode import CodeModeAgent

from ._deploy_agents import ops_agent


def agents() -> list[CodeModeAgent]:
    """The new code's agents."""
    return [ops_agent("new")]
