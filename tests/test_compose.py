"""`docker-compose.temporal.yml` is a cluster our workers and CLI reach with their defaults.

Docker is not on these machines, so the file is read as data and checked against what the code expects: the
frontend on the port of `DEFAULT_ADDRESS`, the namespace of `DEFAULT_NAMESPACE`, PostgreSQL wired in, the UI and
the admin tools pointed at the server, the search attributes our runs carry registered, every reference defined.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_codemode.client._connect import DEFAULT_ADDRESS, DEFAULT_NAMESPACE
from durable_codemode.shared._names import AGENT_SEARCH_ATTRIBUTE, STATUS_SEARCH_ATTRIBUTE

COMPOSE = Path(__file__).parent.parent / "docker-compose.temporal.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert set(document) <= {"services", "volumes", "networks"}, "unknown top-level keys"
    found: dict[str, dict[str, Any]] = document["services"]
    return found


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    return dict(item.split("=", 1) for item in env) if isinstance(env, list) else {k: str(v) for k, v in env.items()}


def _published(service: dict[str, Any]) -> dict[int, int]:
    """Host port -> container port."""
    pairs = (str(p).rsplit(":", 2)[-2:] for p in service.get("ports", []))
    return {int(host): int(container) for host, container in pairs}


def test_the_frontend_is_where_clients_and_workers_look_by_default(services: dict[str, dict[str, Any]]) -> None:
    port = int(DEFAULT_ADDRESS.rsplit(":", 1)[1])
    assert _published(services["temporal"]) == {port: 7233}
    assert _env(services["temporal"]).get("DEFAULT_NAMESPACE", "default") == DEFAULT_NAMESPACE


def test_the_server_persists_to_the_postgresql_service(services: dict[str, dict[str, Any]]) -> None:
    server, db = _env(services["temporal"]), services["postgresql"]
    assert server["DB"].startswith("postgres")
    assert server["POSTGRES_SEEDS"] == "postgresql"
    assert (server["POSTGRES_USER"], server["POSTGRES_PWD"]) == (
        _env(db)["POSTGRES_USER"], _env(db)["POSTGRES_PASSWORD"])
    assert services["temporal"]["depends_on"]["postgresql"]["condition"] == "service_healthy"
    assert "healthcheck" in db
    volume = db["volumes"][0].split(":")[0]
    assert volume in (yaml.safe_load(COMPOSE.read_text()).get("volumes") or {}), "the data volume is declared"


def test_the_ui_and_the_admin_tools_point_at_the_server(services: dict[str, dict[str, Any]]) -> None:
    for name in ("temporal-ui", "temporal-admin-tools", "temporal-setup"):
        assert _env(services[name])["TEMPORAL_ADDRESS"] == "temporal:7233", name
    assert 8080 in _published(services["temporal-ui"])


def test_the_search_attributes_runs_carry_are_registered(services: dict[str, dict[str, Any]]) -> None:
    script = " ".join(services["temporal-setup"]["command"])
    assert "temporal operator cluster health" in script  # waits for the server before registering
    for name in (AGENT_SEARCH_ATTRIBUTE, STATUS_SEARCH_ATTRIBUTE):
        assert name in script
    assert f"--namespace {DEFAULT_NAMESPACE}" in script and "--type Keyword" in script
    assert services["temporal-setup"].get("restart") == "no"  # a one-shot, not a crash loop


def test_references_resolve_and_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        depends = service.get("depends_on", [])
        assert set(depends) <= set(services), f"{name} depends on an undefined service"
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image version ({image})"
