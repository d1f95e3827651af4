"""The agent and status of a run where Temporal's visibility (the UI's filters, `codemode runs`) can find them.

Search attributes, when the server has them: `CodemodeAgent` and `CodemodeStatus` (both Keyword). The
embedded dev server registers them (`client/_devserver.DEV_SERVER_DEFAULT_ARGS`); on a real cluster, once per namespace:

```
temporal operator search-attribute create --namespace default --name CodemodeAgent --type Keyword
temporal operator search-attribute create --namespace default --name CodemodeStatus --type Keyword
```

A server without them refuses a start that sets them (INVALID_ARGUMENT "no mapping defined for search attribute")
and a list query that names them. Then runs are started with the agent and status in their memo instead, which
visibility cannot filter on, so `codemode runs` filters what it reads; a warning says so, once per server and
namespace. Whichever a run was started with is what its workflow updates (`workflow/_progress`), so the choice is
part of the run's recorded input and never changes how it replays.
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from .shared._names import AGENT_MEMO, AGENT_SEARCH_ATTRIBUTE, STATUS_MEMO, STATUS_RUNNING, STATUS_SEARCH_ATTRIBUTE

__all__ = ["AGENT_KEY", "STATUS_KEY", "lacks_search_attributes", "start_options", "uses_search_attributes"]

AGENT_KEY = SearchAttributeKey.for_keyword(AGENT_SEARCH_ATTRIBUTE)
STATUS_KEY = SearchAttributeKey.for_keyword(STATUS_SEARCH_ATTRIBUTE)

_logger = logging.getLogger("durable_codemode")

_without: set[tuple[str, str]] = set()
"""(address, namespace) of servers seen without the search attributes, in this process."""

HOW_TO_REGISTER = (
    f"register them once per namespace: `temporal operator search-attribute create --name {AGENT_SEARCH_ATTRIBUTE} "
    f"--type Keyword` and the same for {STATUS_SEARCH_ATTRIBUTE}"
)


def _server(client: Client) -> tuple[str, str]:
    return client.service_client.config.target_host, client.namespace


def uses_search_attributes(client: Client) -> bool:
    """Whether runs on this client's server get the search attributes (as far as this process knows)."""
    return _server(client) not in _without


def lacks_search_attributes(client: Client, error: RPCError) -> bool:
    """Whether `error` says the server has not registered our search attributes; if so, remember it and warn once."""
    message = error.message or ""
    if error.status != RPCStatusCode.INVALID_ARGUMENT or "search attribute" not in message or not any(
            name in message for name in (AGENT_SEARCH_ATTRIBUTE, STATUS_SEARCH_ATTRIBUTE)):
        return False
    if _server(client) not in _without:
        _without.add(_server(client))
        _logger.warning("the Temporal server at %s (namespace %s) has no %s / %s search attributes, so runs keep "
                        "their agent and status in the memo and `codemode runs` filters by reading it; %s",
                        *_server(client), AGENT_SEARCH_ATTRIBUTE, STATUS_SEARCH_ATTRIBUTE, HOW_TO_REGISTER)
    return True


def start_options(client: Client, agent: str) -> dict[str, Any]:
    """The `start_workflow` options that make a run of `agent` findable by agent and status."""
    if uses_search_attributes(client):
        return {"memo": {AGENT_MEMO: agent}, "search_attributes": TypedSearchAttributes([
            SearchAttributePair(AGENT_KEY, agent), SearchAttributePair(STATUS_KEY, STATUS_RUNNING)])}
    return {"memo": {AGENT_MEMO: agent, STATUS_MEMO: STATUS_RUNNING}}
