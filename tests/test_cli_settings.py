"""The command line's client commands: the daemon's address and token without loading
the configuration when no file is in play, the same as loading it, and a start that
imports only the client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conduit.client import LoginToken
from conduit.daemon.client_settings import ClientSettings, client_settings, login_token
from conduit.daemon.config import load_config

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = ("CONDUIT_CONFIG", "CONDUIT_SOCKET", "CONDUIT_STATE_DIR", "CONDUIT_TOKEN")


def _loaded(socket: str | None) -> ClientSettings:
    config = load_config(None, overrides={"server.socket": socket})
    return ClientSettings(config.server.socket, login_token(config))


@pytest.mark.parametrize("socket", [None, "/run/flag.sock"])
@pytest.mark.parametrize(
    "env",
    [
        {},
        {"CONDUIT_SOCKET": "/run/env.sock"},
        {"CONDUIT_TOKEN": "cdt_env"},
        {"CONDUIT_STATE_DIR": "state"},
        {"XDG_STATE_HOME": "xdg-state", "XDG_RUNTIME_DIR": "xdg-run"},
    ],
)
@pytest.mark.parametrize("token_file", [False, True])
def test_without_a_config_file_the_settings_are_the_loaded_configs(
    tmp_path: Path, monkeypatch: Any, env: dict[str, str], socket: str | None, token_file: bool
) -> None:
    for variable in (*VARIABLES, "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for variable, value in env.items():
        # Relative values name directories under tmp_path.
        monkeypatch.setenv(
            variable, value if value.startswith(("/", "cdt_")) else f"{tmp_path}/{value}"
        )
    if token_file:
        state = Path(load_config(None).server.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        (state / "master.token").write_text("cdt_from-the-file\n")

    light = client_settings(None, socket=socket)
    assert light == _loaded(socket)
    if token_file and "CONDUIT_TOKEN" not in env:
        assert light.login == LoginToken("cdt_from-the-file", fallback=True)


def test_with_a_config_file_the_file_is_read(tmp_path: Path, monkeypatch: Any) -> None:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    config = tmp_path / "conduit.toml"
    config.write_text('[server]\nsocket = "/run/file.sock"\n[auth]\ntoken = "cdt_file"\n')
    assert client_settings(str(config)) == ClientSettings("/run/file.sock", LoginToken("cdt_file"))
    monkeypatch.setenv("CONDUIT_CONFIG", str(config))
    assert client_settings(None, socket="/run/flag.sock").socket == "/run/flag.sock"


_PROBE = """
import sys
from conduit.daemon.cli import main
status = main(["call", "ping"])
heavy = ["pydantic", "conduit.gateway", "conduit.daemon.config", "trio", "wasmtime", "httpx"]
print(status, [name for name in heavy if name in sys.modules])
"""


def test_a_client_command_imports_only_the_client(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CONDUIT_SOCKET": str(tmp_path / "s")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split(maxsplit=1) == ["3", "[]\n"]
    assert "cannot reach the daemon at" in done.stderr


_CONFIG_PROBE = """
import sys
from conduit.daemon.config import load_config
config = load_config(sys.argv[1])
assert config.upstreams[0].auth.type == "bearer"
heavy = ["httpx", "trio", "mcp", "wasmtime", "conduit.gateway.catalogue"]
print([name for name in heavy if name in sys.modules])
"""

_CONFIG_WITH_UPSTREAM = """
[[upstreams]]
name = "remote"
transport = "http"
url = "https://tools.example.com/mcp"
[upstreams.auth]
type = "bearer"
token = "t"
[gateway.fetch]
enabled = true
allowed_hosts = ["api.example.com"]
"""


def test_reading_a_configuration_imports_no_network_or_runtime(tmp_path: Path) -> None:
    """Client commands given a config file read it: that must not cost the daemon's
    imports (an HTTP client, Trio, the MCP SDK, Wasmtime). Only an OAuth2 `token_url`
    is checked with the HTTP client's own URL parser, which it then imports."""
    config = tmp_path / "conduit.toml"
    config.write_text(_CONFIG_WITH_UPSTREAM)
    done = subprocess.run(
        [sys.executable, "-c", _CONFIG_PROBE, str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"
