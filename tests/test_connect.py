"""Where `connect()` connects: arguments over the environment over a Temporal profile file over defaults.

Against the real dev server of the session; a profile file is the TOML file the `temporal` CLI reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_codemode import CodeModeUserError, connect
from durable_codemode.client._connect import DEFAULT_ADDRESS, DEFAULT_NAMESPACE, configured_address, connect_settings

_SETTINGS = ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_PROFILE", "TEMPORAL_API_KEY", "TEMPORAL_TLS",
             "TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH")


@pytest.fixture(autouse=True)
def no_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test starts with no Temporal settings: none from the environment, and a profile file that is absent."""
    for name in _SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "absent.toml"))


def _profile_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = tmp_path / "temporal.toml"
    path.write_text(text)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(path))


def test_with_nothing_configured_the_defaults_apply() -> None:
    assert configured_address() is None
    settings = connect_settings()
    assert (settings["target_host"], settings["namespace"]) == (DEFAULT_ADDRESS, DEFAULT_NAMESPACE)


async def test_the_environment_names_the_server(env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    address = env.client.service_client.config.target_host
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    client = await connect()
    assert client.service_client.config.target_host == address
    assert client.namespace == "default"
    assert await client.count_workflows() is not None  # a real round trip to that server


async def test_a_profile_names_the_server_and_the_environment_and_arguments_win(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    address = env.client.service_client.config.target_host
    _profile_file(tmp_path, monkeypatch, f'[profile.default]\naddress = "{address}"\nnamespace = "default"\n'
                                         '[profile.other]\naddress = "profile-host:1"\nnamespace = "other-ns"\n')
    assert configured_address() == address
    client = await connect()
    assert (client.service_client.config.target_host, client.namespace) == (address, "default")
    await client.count_workflows()

    monkeypatch.setenv("TEMPORAL_PROFILE", "other")
    assert connect_settings()["target_host"] == "profile-host:1"
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "env-ns")
    assert connect_settings()["namespace"] == "env-ns"  # the environment over the profile
    settings = connect_settings("arg-host:2", "arg-ns")
    assert (settings["target_host"], settings["namespace"]) == ("arg-host:2", "arg-ns")  # arguments over both


def test_an_api_key_turns_tls_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_API_KEY", "secret")
    settings = connect_settings("cloud-host:7233")
    assert settings["api_key"] == "secret"
    assert settings.get("tls") is not None and settings.get("tls") is not False


def test_an_unknown_profile_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _profile_file(tmp_path, monkeypatch, '[profile.default]\naddress = "h:1"\n')
    with pytest.raises(CodeModeUserError, match=r"Profile 'prod' not found.*TEMPORAL_PROFILE"):
        connect_settings(profile="prod")


def test_a_malformed_profile_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _profile_file(tmp_path, monkeypatch, "this is not [[ toml")
    with pytest.raises(CodeModeUserError, match=r"cannot load the Temporal client configuration.*TOML"):
        configured_address()


async def test_a_missing_certificate_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "client.pem"
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(missing))
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_KEY_PATH", str(missing))
    with pytest.raises(CodeModeUserError, match=f"does not exist: {missing}"):
        await connect("localhost:1")


async def test_tls_to_a_plaintext_server_fails_with_a_reason(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEMPORAL_TLS", "true")
    with pytest.raises(CodeModeUserError, match="server speaks plaintext: unset TEMPORAL_TLS"):
        await connect(env.client.service_client.config.target_host)
